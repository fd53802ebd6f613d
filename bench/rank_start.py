"""Rank start: what each MPI rank runs before the user's program.

``training-toolkit-rank FILE`` (C) reads the file its host's ``train`` wrote once and starts the command
(until commit f3723e3 every rank started ``python -m training_toolkit.rank``, about 50 ms on an idle machine,
which re-read ``/opt/ml``: docs/benchmarks.md, "Rank start"; it no longer runs against today's modules).
Each is timed starting ``/bin/true`` with a realistic job environment, interleaved with
``/bin/true`` alone (bare) so a slow moment hits all alike.  Since 7f4f8b7 the rank program stays the rank's parent (it forks, waits and passes the rank's end
on) where it exec'd the rank before: the exec'ing one is built from git (``EXEC_ONLY``, 2ddb418's
``rank_exec.c``) and timed beside it, and the parent's own memory is read while a rank runs (its RSS and
PSS: what each rank costs its host for as long as the rank runs).
Usage: .venv/bin/python bench/rank_start.py [ROUNDS]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, env_for, make_tree, median_ms, timed

sys.path.insert(0, str(REPO / "src"))
from training_toolkit import native  # noqa: E402
from training_toolkit.job import contract
from training_toolkit.core import hardware
from training_toolkit.job import spec as job
from training_toolkit.job.mpi_options import CustomMpiOptions  # noqa: E402
from training_toolkit.core.paths import Paths  # noqa: E402
from training_toolkit.runners import rank_env  # noqa: E402

EXEC_ONLY = "2ddb418"  # the last rank program that exec'd the rank (no parent left)
HPS = {f"hp_{i}": f'"value {i}"' for i in range(20)}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    with tempfile.TemporaryDirectory() as tmp:
        base = make_tree(Path(tmp) / "opt" / "ml", "pass\n", hps=HPS)
        env = env_for(base)
        spec = job.load_job(Paths.at(str(base)), env, hardware.probe(None))
        ranks = rank_env.rank_environment(contract.script_environment(spec, env), interface="eth0",
                                          custom=CustomMpiOptions(), extra={}, preload=None)
        rank_file = Path(tmp) / "rank.env"
        size = rank_file.write_bytes(rank_env.encode_rank_file(str(base / "code"), ["/bin/true"], ranks))
        program = str(native.path_of(native.RANK_PROGRAM))
        exec_only = build_exec_only(Path(tmp))
        samples: dict[str, list[float]] = {"bare": [], "after": [], "exec": []}
        for _ in range(rounds):
            samples["bare"].append(timed(["/bin/true"], env))
            samples["after"].append(timed([program, str(rank_file)], env))
            samples["exec"].append(timed([exec_only, str(rank_file)], env))
        sleeping = Path(tmp) / "sleep.env"
        sleeping.write_bytes(rank_env.encode_rank_file(str(base / "code"), ["/bin/sleep", "5"], ranks))
        rss, pss = parent_memory_kb(program, sleeping, env)
    bare, after, exec_ = (median_ms(samples[k]) for k in ("bare", "after", "exec"))
    print(f"rank start, median of {rounds} interleaved runs ({os.cpu_count()} cores; "
          f"{len(ranks)} variables, a {size}-byte rank file):")
    print(f"  bare /bin/true                          {bare:7.2f} ms")
    print(f"  after:  training-toolkit-rank FILE      {after:7.2f} ms   (+{after - bare:.2f} ms over bare; the rank's parent)")
    print(f"  exec'ing rank program ({EXEC_ONLY})      {exec_:7.2f} ms   (+{exec_ - bare:.2f} ms over bare)")
    print(f"  the rank's parent while its rank runs: RSS {rss} kB, PSS {pss} kB")


def build_exec_only(where: Path) -> str:
    """The rank program as it was before it stayed the rank's parent, built from git with the same flags."""
    src = where / "exec_only"
    src.mkdir()
    for name in ("rank_exec.c", "nodepath.h"):
        (src / name).write_text(subprocess.run(["git", "-C", str(REPO), "show", f"{EXEC_ONLY}:src/training_toolkit/native/{name}"],
                                               check=True, capture_output=True, text=True).stdout)
    out = src / "training-toolkit-rank"
    subprocess.run(["cc", "-O2", "-o", str(out), str(src / "rank_exec.c")], check=True)
    return str(out)


def parent_memory_kb(program: str, rank_file: Path, env: dict[str, str]) -> tuple[int, int]:
    """The rank program's RSS and PSS (kB) while its rank (sleep) runs."""
    import time

    proc = subprocess.Popen([program, str(rank_file)], env=env)
    try:
        deadline = time.monotonic() + 5
        while not _children(proc.pid):
            if time.monotonic() > deadline:
                raise SystemExit("the rank did not start")
            time.sleep(0.01)
        rollup = Path(f"/proc/{proc.pid}/smaps_rollup").read_text().splitlines()
        value = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:] if line.split()[-1] == "kB"}
        return value["Rss"], value["Pss"]
    finally:
        children = _children(proc.pid)
        proc.kill()
        proc.wait()
        for pid in children:
            os.kill(pid, 9)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


if __name__ == "__main__":
    main()
