"""The dead-man switch's cost: what waits on every host for the whole job, and how long it takes to start.

Compares the native ``training-toolkit-deadman`` (supervise/deadman.py) with what it replaced (a ``sh``
blocked in ``read``) and with the cheapest Python watcher (``python -I -S``, blocked in a read): the
start (Popen until it returns, on ``train``'s path before every child it supervises), the resident
memory while it waits, and, for the deadman, from its owner's SIGKILL to the watched process's end.

Usage: .venv/bin/python bench/deadman.py [RUNS]
"""

from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
import time

from training_toolkit import native
from training_toolkit.supervise import pidfd

WATCHERS = {
    "sh (before)": ["/bin/sh", "-c", "read -r said", "tripwire"],
    "python -I -S": [sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.buffer.read()"],
    "deadman (native)": [str(native.path_of(native.DEADMAN_PROGRAM)), "--marker", "X=1"],
}


def rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) in kB."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                values[name] = int(rest.split()[0])
    return values["VmRSS"], values["RssAnon"]


def measure(argv: list[str], runs: int) -> tuple[float, tuple[int, int]]:
    starts, rss = [], (0, 0)
    for _ in range(runs):
        began = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True, env={"PATH": "/usr/bin:/bin"})
        starts.append(time.perf_counter() - began)
        time.sleep(0.15)  # settled, blocked in its read
        rss = rss_kb(proc.pid)
        proc.stdin.write(b"done\n")
        proc.stdin.close()
        proc.wait()
    return statistics.median(starts) * 1000, rss


def kill_to_gone(runs: int) -> float:
    owner = ("import sys, subprocess, time\nfrom training_toolkit.supervise.deadman import Deadman\n"
             "d = Deadman()\np = subprocess.Popen(['sleep', '60'], env=d.environment())\nd.watch(p.pid)\n"
             "print(p.pid, flush=True)\ntime.sleep(60)\n")
    times = []
    for _ in range(runs):
        proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
        fd = os.pidfd_open(int(proc.stdout.readline()))
        proc.kill()
        began = time.perf_counter()
        select.select([fd], [], [], 5)
        times.append(time.perf_counter() - began)
        os.close(fd)
        proc.wait()
    return statistics.median(times) * 1000


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    print(f"{'watcher':<18} {'start ms':>9} {'VmRSS kB':>9} {'anon kB':>8}   (median of {runs})")
    for name, argv in WATCHERS.items():
        start_ms, (rss, anon) = measure(argv, runs)
        print(f"{name:<18} {start_ms:9.2f} {rss:9d} {anon:8d}")
    print(f"owner SIGKILLed -> watched process gone: {kill_to_gone(runs):.1f} ms (pidfds here: {pidfd.available()})")


if __name__ == "__main__":
    main()
