"""Where each host's CPU goes in an MPI job: CPU time per host by kind of process, ours beside bare.

For each N (default 16), one MPI job of N hosts x 1 rank (mpi4py allreduce) through ``run_local``,
then a bare ``mpirun`` with the same options on N hosts prepared in advance (as ``bench/scale.py``:
sshd up, keys in place, no connection left open). While each runs, a thread looks at every
process in the job's hosts every 50 ms and keeps each one's CPU time (utime + stime) by kind:
``train`` (every process of the toolkit's command, and its dead-man switches), ``rank`` (the script), ``orted``, ``mpirun``,
``ssh`` (the probe's shared connection, mpirun's sessions), ``sshd``, ``shell`` (what sshd runs
for a session: the login shell and what the user's rc files start), ``init`` (each host's
reaper), ``other``. A process that lives less than a look is missed by the kinds but not by the
total, which comes from the benchmark's own cgroup (``common.CpuMeter``; the sampling thread is
moved out of it): the difference is printed as ``short-lived``, with the kernel's work for the job
that no process is charged for. Milliseconds per host; the same on a loaded or a quiet machine,
unlike wall time.

Needs root, Open MPI, openssh-server and mpi4py.  Usage: .venv/bin/python bench/host_cpu.py [N ...]
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import threading
from pathlib import Path

from common import CpuMeter, LocalRun
from mpi_job import ALLREDUCE, bare, prepare
from scale import hosts, mpi_job

from training_toolkit.local.netns import NamespaceCluster, leftovers

KINDS = ("train", "rank", "orted", "mpirun", "ssh", "sshd", "shell", "init", "other")
TICK = os.sysconf("SC_CLK_TCK")


def kind_of(comm: str, argv: list[str]) -> str:
    if any(Path(a).name == "train" for a in argv[:2]) or (argv and Path(argv[0]).name == "training-toolkit-deadman"):
        return "train"  # the toolkit's own dead-man switches count with it
    if comm in ("orted", "mpirun", "ssh", "sshd"):  # before the script's name, which bare mpirun's line has
        return comm
    if any(a.endswith("allreduce.py") for a in argv):
        return "rank"
    if argv[:3] == [sys.executable, "-I", "-S"] or (argv and "-I" in argv[:3] and "-S" in argv[:3]):
        return "init"
    if comm in ("bash", "sh", "cat", "readlink", "sed", "tr", "head", "sort", "mkdir", "rm", "chmod", "diff",
                "basename", "dirname", "mktemp", "xargs", "od", "pyenv"):
        return "shell"
    return "other"


class Sampler:
    """The highest CPU time seen for each process of ``pids()``, by pid, with its kind."""

    def __init__(self, pids, meter: CpuMeter) -> None:
        self._pids = pids
        self._meter = meter
        self.seen: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        self._meter.exclude_this_thread()  # its looks are not the job's CPU
        while not self._stop.wait(0.05):
            for pid in self._pids():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        stat = f.read()
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                except OSError:
                    continue
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                ticks = int(fields[11]) + int(fields[12])
                previous = self.seen.get(pid)
                if previous is None or ticks >= previous[1]:
                    # An ending process (a zombie) has no command line left: it keeps the kind it had.
                    kind = previous[0] if previous is not None and not argv else kind_of(comm, argv)
                    self.seen[pid] = (kind, ticks)

    def stop(self) -> dict[str, float]:
        """Seconds of CPU by kind."""
        self._stop.set()
        self._thread.join()
        totals: dict[str, float] = collections.defaultdict(float)
        for kind, ticks in self.seen.values():
            totals[kind] += ticks / TICK
        return totals


def all_pids(cluster: NamespaceCluster) -> list[int]:
    return [pid for pids in cluster.pids().values() for pid in pids]


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [16]
    tags: list[str] = []
    left: list[str] = []
    meter = CpuMeter()
    if meter.seconds() is None:
        raise SystemExit("no cpuacct cgroup to meter the jobs' CPU")
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-host-cpu-") as tmp:
            src = Path(tmp) / "src"
            src.mkdir()
            (src / "allreduce.py").write_text(ALLREDUCE)
            for n in sizes:
                box: dict[str, Sampler] = {}

                def up(cluster, box=box):
                    box["at"] = meter.seconds()
                    box["sampler"] = Sampler(lambda: all_pids(cluster), meter)

                run = LocalRun(mpi_job(src, n), Path(tmp) / f"mpi-{n}", tags, timeout_s=600, before_start=up)
                ours_total = meter.seconds() - box["at"]
                ours = box["sampler"].stop()
                run.check(f"mpi on {n} hosts")
                prepared = NamespaceCluster(hosts(n), Path(tmp) / f"prepared-{n}")
                try:
                    prepared.start()
                    mpirun = prepare(prepared, src)
                    before = meter.seconds()
                    sampler = Sampler(lambda prepared=prepared: all_pids(prepared), meter)
                    bare(prepared, mpirun, "allreduce.py")
                    bare_total = meter.seconds() - before
                    theirs = sampler.stop()
                finally:
                    prepared.close()
                    left += prepared.leftovers()
                rows.append((n, ours, ours_total, theirs, bare_total))
    finally:
        meter.close()
    left += [item for tag in tags for item in leftovers(tag)]
    for n, ours, ours_total, theirs, bare_total in rows:
        print(f"\n{n} hosts: CPU per host (ms), from the hosts being up to the job's end")
        print("| kind | ours | bare | ours - bare |")
        print("| --- | --- | --- | --- |")
        for kind in (*KINDS, "short-lived", "total"):
            if kind == "short-lived":
                a, b = ours_total - sum(ours.values()), bare_total - sum(theirs.values())
            elif kind == "total":
                a, b = ours_total, bare_total
            else:
                a, b = ours.get(kind, 0.0), theirs.get(kind, 0.0)
            print(f"| {kind} | {a / n * 1000:.0f} | {b / n * 1000:.0f} | {(a - b) / n * 1000:+.0f} |")
    print("nothing left running" if not left else f"LEFT BEHIND: {left}")
    if left:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
