"""Launch overhead: `train` on a no-op script vs the reference's `train` vs `python noop.py`.

Runs are interleaved (ours, reference, bare, ours, ...) so a slow moment hits all three alike.
Beside each median wall time, the median CPU time (user + system of the command and its script,
from the kernel's accounting of this process's children): on a machine shared with other work the
wall time moves with the load, the CPU time much less.
Targets: ours <= 0.18 x the reference (issue 24), and within 60 ms of the bare command.
``--before REV``: also the toolkit of git revision REV (a detached worktree on PYTHONPATH; ours then
runs with this checkout's src on PYTHONPATH alike), in the same interleaving.
Usage: .venv/bin/python bench/launch_overhead.py [ROUNDS] [--before REV]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

from common import OURS, PYTHON, REFERENCE, REPO, before_tree, env_for, have_reference, make_tree, median_ms, timed


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sample(samples: dict[str, list[tuple[float, float]]], name: str, cmd: list[str], env: dict[str, str],
           cwd: Path | None = None) -> None:
    cpu = children_cpu_s()
    wall = timed(cmd, env, cwd=cwd)
    samples.setdefault(name, []).append((wall, children_cpu_s() - cpu))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", nargs="?", type=int, default=20)
    parser.add_argument("--before", help="a git revision whose toolkit is timed too, interleaved")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, before_tree(args.before, Path(tmp) / "before") as before_src:
        ours_tree = make_tree(Path(tmp) / "ours", "pass\n")
        before_job = make_tree(Path(tmp) / "before-job", "pass\n")
        ref_tree = make_tree(Path(tmp) / "ref", "pass\n")
        with_ref = have_reference()
        ours_env = env_for(ours_tree) if before_src is None else {**env_for(ours_tree), "PYTHONPATH": str(REPO / "src")}
        samples: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            sample(samples, "ours", [str(OURS)], ours_env)
            if before_src is not None:
                sample(samples, "before", [str(OURS)], {**env_for(before_job), "PYTHONPATH": str(before_src)})
            if with_ref:
                sample(samples, "reference", [str(REFERENCE)], env_for(ref_tree))
            sample(samples, "bare", [str(PYTHON), "job.py"], env_for(ours_tree), cwd=ours_tree / "code")
    wall = {name: median_ms([w for w, _ in runs]) for name, runs in samples.items()}
    cpu = {name: statistics.median(c for _, c in runs) * 1000 for name, runs in samples.items()}
    print(f"launch overhead, median of {args.rounds} interleaved runs (wall; CPU of the command and its script):")
    print(f"  bare python noop.py       {wall['bare']:7.1f} ms   CPU {cpu['bare']:6.1f} ms")
    print(f"  ours: train               {wall['ours']:7.1f} ms   CPU {cpu['ours']:6.1f} ms   "
          f"(+{wall['ours'] - wall['bare']:.1f} ms over bare; target <= 60)")
    if "before" in wall:
        print(f"  before ({args.before}): train {wall['before']:7.1f} ms   CPU {cpu['before']:6.1f} ms")
    if "reference" in wall:
        print(f"  reference: train          {wall['reference']:7.1f} ms   CPU {cpu['reference']:6.1f} ms")
        for name in ("ours", "before"):
            if name in wall:
                print(f"  ratio {name}/reference     {wall[name] / wall['reference']:7.3f} wall, "
                      f"{cpu[name] / cpu['reference']:.3f} CPU (target <= 0.18)")


if __name__ == "__main__":
    main()
