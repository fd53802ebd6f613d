"""What resilience costs a job that does not use it: launch overhead and output throughput, before and after.

"Before" is the toolkit at a git revision (default: where this branch left main, ``git merge-base HEAD main``),
unpacked to a temporary directory; "after" is this checkout.  Both run as ``python -c 'train_main()'`` with
their own ``src`` first on ``PYTHONPATH``, from the same interpreter, interleaved round by round, so only the
code differs.  Targets (issue 13): launch within 5 ms, output throughput ratio within 0.05.
Lines marked (info): the same job with the stall watch on (stdout is then relayed, to see progress).

Usage: .venv/bin/python bench/resilience_cost.py [ROUNDS] [MEGABYTES] [REVISION]
"""

from __future__ import annotations

import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from common import PYTHON, REPO, env_for, make_tree
from output_throughput import SCRIPT, drain

TRAIN = "import sys; from training_toolkit.cli import train_main; sys.exit(train_main())"


def unpack(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "src"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into)  # our own repository's files
    return into / "src"


def command(src: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    return [str(PYTHON), "-c", TRAIN], {**env, "PYTHONPATH": str(src)}


def launch(src: Path, tree: Path, extra: dict[str, str]) -> float:
    cmd, env = command(src, {**env_for(tree), **extra})
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"{src}: train failed with {done.returncode}")
    return time.perf_counter() - t0


def throughput(src: Path, tree: Path, extra: dict[str, str]) -> float:
    cmd, env = command(src, {**env_for(tree), **extra})
    return drain(cmd, env, None, "stdout")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    megabytes = float(sys.argv[2]) if len(sys.argv) > 2 else 100
    revision = sys.argv[3] if len(sys.argv) > 3 else subprocess.run(
        ["git", "-C", str(REPO), "merge-base", "HEAD", "main"], capture_output=True, text=True, check=True).stdout.strip()
    watch = {"TRAINING_TOOLKIT_STALL_TIMEOUT": "600"}
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as tmp:
        before, after = unpack(revision, Path(tmp) / "before"), REPO / "src"
        noop = make_tree(Path(tmp) / "noop", "pass\n")
        chatty = make_tree(Path(tmp) / "chatty", SCRIPT, hps={"megabytes": str(megabytes), "stream": '"stdout"'})
        times: dict[str, list[float]] = {k: [] for k in ("before", "after", "after+watch")}
        for _ in range(rounds):
            times["before"].append(launch(before, noop, {}))
            times["after"].append(launch(after, noop, {}))
            times["after+watch"].append(launch(after, noop, watch))
        flows: dict[str, list[float]] = {k: [] for k in ("before", "after", "after+watch")}
        for _ in range(max(3, rounds // 6)):
            flows["before"].append(throughput(before, chatty, {}))
            flows["after"].append(throughput(after, chatty, {}))
            flows["after+watch"].append(throughput(after, chatty, watch))
    ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
    low = {k: min(v) * 1000 for k, v in times.items()}
    secs = {k: statistics.median(v) for k, v in flows.items()}
    print(f"launch of a no-op job, {rounds} interleaved rounds, before = {revision[:10]}:")
    print(f"  before        median {ms['before']:6.1f} ms  (min {low['before']:.1f})")
    print(f"  after         median {ms['after']:6.1f} ms  (min {low['after']:.1f})   "
          f"difference {ms['after'] - ms['before']:+.1f} ms (target within 5)")
    print(f"  after, watch  median {ms['after+watch']:6.1f} ms  (min {low['after+watch']:.1f})   (info)")
    print(f"stdout, {megabytes:.0f} MB of log lines through train, median of {len(flows['before'])}:")
    print(f"  before {secs['before']:.3f} s   after {secs['after']:.3f} s   "
          f"ratio {secs['after'] / secs['before']:.3f} (target within 0.05 of 1)")
    print(f"  after, watch {secs['after+watch']:.3f} s   ratio {secs['after+watch'] / secs['before']:.3f} (info: stdout relayed)")
    print(f"  (cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}: a loaded machine makes every figure noisy)")


if __name__ == "__main__":
    main()
