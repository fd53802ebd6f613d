"""A rank SIGTERMed from outside (not a stop): the time from the signal to the job's end, quiet and under load.

A rank that dies of a SIGTERM its host's ``train`` did not send (someone's ``kill``) is a failure, not a stop:
the job must end at once.  Its end still waits, ``STOP_HEARD_S`` (2 s) at most, for its host to say whether
a stop is on (native/rank_exec.c: the rank's parent cannot tell a platform's stop that reached the rank first
from a stray signal), then Open MPI's runtime ends the other ranks and every host ends with the verdict.

``training-toolkit local --hosts 2 --distribution mpi --processes-per-host 2``, the ranks in mpi4py sleeping
with no handler; once all four run, rank 3 (on algo-2) gets SIGTERM, and the figure is the time until
``local`` returns (every host's verdict in).  Under load, LOAD busy loops run on the machine meanwhile.
Usage: .venv/bin/python bench/rank_sigterm.py [ROUNDS] [--load N ...]   (default 3 rounds, loads 0 and 6)
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO

LOCAL = str(REPO / ".venv" / "bin" / "training-toolkit")
SCRIPT = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"


def rank_pid(rank: int, tag: str) -> int | None:
    """The host pid of the job's rank ``rank`` (its environment names its rank and the bench's tag)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"job.py" in cmd and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and f"BENCH_TAG={tag}".encode() in env:
            return int(entry)
    return None


def one_round(load: int, round_: int) -> tuple[float, int]:
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "src"
            src.mkdir()
            (src / "job.py").write_text(SCRIPT)
            tag = f"{os.getpid()}-{round_}-{load}"
            local = subprocess.Popen([LOCAL, "local", "--hosts", "2", "--distribution", "mpi", "--processes-per-host",
                                      "2", "--source", str(src), "--entry-point", "job.py", "--workdir",
                                      str(Path(tmp) / "w"), "--env", f"BENCH_TAG={tag}", "--timeout", "300"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 180
            while not all(rank_pid(r, tag) for r in range(4)):
                if time.monotonic() > deadline or local.poll() is not None:
                    local.kill()
                    raise SystemExit(f"the ranks did not start (local: {local.poll()})")
                time.sleep(0.2)
            time.sleep(1.0)  # every rank past MPI_Init
            victim = rank_pid(3, tag)
            assert victim is not None
            start = time.monotonic()
            os.kill(victim, signal.SIGTERM)
            code = local.wait(120)
            return time.monotonic() - start, code
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def main() -> None:
    args = sys.argv[1:]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 3
    loads = [int(a) for a in args[args.index("--load") + 1:]] if "--load" in args else [0, 6]
    for load in loads:
        taken, codes = [], []
        for round_ in range(rounds):
            took, code = one_round(load, round_)
            taken.append(took)
            codes.append(code)
        print(f"load {load}: a rank SIGTERMed from outside to the job's end: median {statistics.median(taken):.2f} s "
              f"(min {min(taken):.2f}, max {max(taken):.2f}; {rounds} runs); local's exit codes {codes}")


if __name__ == "__main__":
    main()
