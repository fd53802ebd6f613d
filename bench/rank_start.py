"""Rank start: what each MPI rank runs before the user's program, before and after the per-host rank file.

Before (up to commit f3723e3): every rank started ``python -m training_toolkit.rank``, which
re-read its host's ``/opt/ml`` and rebuilt the contract, then exec'd the command.  Now:
``training-toolkit-rank FILE`` (C) reads the file its host's ``train`` wrote once and execs.
Each is timed starting ``/bin/true`` with a realistic job environment, interleaved with
``/bin/true`` alone (bare) so a slow moment hits all three alike.  The old wrapper is taken
from git history (``git show f3723e3:src/training_toolkit/rank.py``), run against today's
modules.
Usage: .venv/bin/python bench/rank_start.py [ROUNDS]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PYTHON, REPO, env_for, make_tree, median_ms, timed

sys.path.insert(0, str(REPO / "src"))
from training_toolkit import native  # noqa: E402
from training_toolkit.job import contract
from training_toolkit.core import hardware
from training_toolkit.job import spec as job
from training_toolkit.job.mpi_options import CustomMpiOptions  # noqa: E402
from training_toolkit.core.paths import Paths  # noqa: E402
from training_toolkit.runners import rank_env  # noqa: E402

BEFORE = "f3723e3"
HPS = {f"hp_{i}": f'"value {i}"' for i in range(20)}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    with tempfile.TemporaryDirectory() as tmp:
        base = make_tree(Path(tmp) / "opt" / "ml", "pass\n", hps=HPS)
        env = env_for(base)
        old = Path(tmp) / "old_rank.py"
        old.write_text(subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:src/training_toolkit/rank.py"],
                                      check=True, capture_output=True, text=True).stdout)
        spec = job.load_job(Paths.at(str(base)), env, hardware.probe(None))
        ranks = rank_env.rank_environment(contract.script_environment(spec, env), interface="eth0",
                                          custom=CustomMpiOptions(), extra={}, preload=None)
        rank_file = Path(tmp) / "rank.env"
        size = rank_file.write_bytes(rank_env.encode_rank_file(str(base / "code"), ["/bin/true"], ranks))
        program = str(native.path_of(native.RANK_PROGRAM))
        old_env = {**env, "PYTHONPATH": str(REPO / "src")}
        samples: dict[str, list[float]] = {"bare": [], "after": [], "before": []}
        for _ in range(rounds):
            samples["bare"].append(timed(["/bin/true"], env))
            samples["after"].append(timed([program, str(rank_file)], env))
            samples["before"].append(timed([str(PYTHON), str(old), "--base-dir", str(base), "--", "/bin/true"], old_env))
    bare, after, before = (median_ms(samples[k]) for k in ("bare", "after", "before"))
    print(f"rank start, median of {rounds} interleaved runs ({os.cpu_count()} cores; "
          f"{len(ranks)} variables, a {size}-byte rank file):")
    print(f"  bare /bin/true                          {bare:7.2f} ms")
    print(f"  after:  training-toolkit-rank FILE      {after:7.2f} ms   (+{after - bare:.2f} ms over bare)")
    print(f"  before: python -m training_toolkit.rank {before:7.2f} ms   (+{before - bare:.2f} ms over bare)")


if __name__ == "__main__":
    main()
