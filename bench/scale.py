"""Cost as hosts grow: a job of N hosts on a local cluster, N = 2, 8, 16, 32, 64 by default.

For each N, one run of each, interleaved:
- ``start to barrier`` and ``barrier to verdict`` of a job under the torch-style launcher (one
  process per host that writes ``time.monotonic()`` first thing and exits): from the hosts being
  up to the last process starting, and from then to the last host's exit;
- an MPI job of N hosts x 1 rank (mpi4py allreduce) through ``run_local``, from the hosts being up
  to the last host's exit, beside a bare ``mpirun`` with the same options on a cluster of N hosts
  prepared in advance (code in place, sshd up, one shared key, no connection left open: the bare
  mpirun logs in to every host itself): ``ours - bare`` is what the toolkit costs, and ``per host``
  divides it by N;
- the CPU time of each of those two (every process of the job, on every host, through a cgroup of
  the benchmark's own: ``common.CpuMeter``), per host: unlike wall time, it does not move with
  whatever else the machine runs.

On this machine every host shares two cores, so per-host CPU shows as wall time; on real hosts
most of it would run in parallel, except the first host's fan-in.  Needs root, Open MPI,
openssh-server and mpi4py.  Usage: .venv/bin/python bench/scale.py [N ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from common import STAMP, CpuMeter, LocalRun, stamps
from mpi_job import ALLREDUCE, bare, prepare

from training_toolkit.local.launcher import LocalJob
from training_toolkit.local.netns import NamespaceCluster, leftovers

def hosts(n: int) -> tuple[str, ...]:
    return tuple(f"algo-{i}" for i in range(1, n + 1))


def launcher_job(src: Path, n: int) -> LocalJob:
    hps = {"sagemaker_program": json.dumps("stamp.py"), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_torch_distributed_enabled": "true"}
    return LocalJob(hosts=hosts(n), hyperparameters=hps, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "300"})


def mpi_job(src: Path, n: int) -> LocalJob:
    hps = {"sagemaker_program": json.dumps("allreduce.py"), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "1"}
    return LocalJob(hosts=hosts(n), hyperparameters=hps, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "300"})


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [2, 8, 16, 32, 64]
    tags: list[str] = []
    rows = []
    left: list[str] = []
    meter = CpuMeter()
    try:
        measure(sizes, meter, tags, rows, left)
    finally:
        meter.close()
    left += [item for tag in tags for item in leftovers(tag)]
    print("\n| hosts | start to barrier | barrier to verdict | MPI job, ours | bare mpirun | ours - bare | per host "
          "| CPU per host, ours | bare | ours - bare |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, barrier, verdict, ours, bare_s, cpu_ours, cpu_bare in rows:
        print(f"| {n} | {barrier:.2f} s | {verdict:.2f} s | {ours:.2f} s | {bare_s:.2f} s | {ours - bare_s:.2f} s "
              f"| {(ours - bare_s) / n * 1000:.0f} ms | {cpu(cpu_ours, n)} | {cpu(cpu_bare, n)} "
              f"| {cpu(cpu_ours - cpu_bare if cpu_ours is not None else None, n)} |")
    print("nothing left running" if not left else f"LEFT BEHIND: {left}")
    if left:
        raise SystemExit(1)


def bare_retried(prepared: NamespaceCluster, mpirun: list[str], tries: int = 3) -> float:
    """Seconds of the bare mpirun, tried again where it failed to start its daemons.

    At 64 hosts on 2 loaded cores (load averages over 30), 3 of 7 bare runs ended at once with
    "ORTE was unable to reliably start one or more daemons" (then "does not know how to route a
    message", with routed=direct too): 64 fresh ssh logins at once, each a key exchange, against
    ssh's 5 s ConnectTimeout.  Ours never did: its probe retries each login and keeps it open for
    mpirun.  A failed try is said, and its CPU counts in the figure (an upper bound for bare).
    """
    for attempt in range(1, tries + 1):
        try:
            return bare(prepared, mpirun, "allreduce.py")
        except SystemExit as exc:
            if attempt == tries:
                raise
            print(f"(bare mpirun failed, try {attempt} of {tries}: {str(exc)[:60]}...)", flush=True)
    raise AssertionError("unreachable")


def cpu(seconds: float | None, n: int) -> str:
    return "n/a (no cpuacct cgroup)" if seconds is None else f"{seconds / n * 1000:.0f} ms"


def measure(sizes: list[int], meter: CpuMeter, tags: list[str], rows: list, left: list[str]) -> None:
    """One launcher job, one MPI job through run_local and one bare mpirun per size, each timed and metered."""
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "stamp.py").write_text(STAMP)
        (src / "allreduce.py").write_text(ALLREDUCE)
        for n in sizes:
            run = LocalRun(launcher_job(src, n), Path(tmp) / f"launcher-{n}", tags, timeout_s=600)
            run.check(f"launcher on {n} hosts")
            starts = stamps(run.results)
            barrier = max(starts) - run.hosts_up
            verdict = run.last_exit - max(starts)
            # CPU from the hosts being up (the platform's part done) to run_local's return, teardown included.
            at_up: list[float | None] = []
            mpi = LocalRun(mpi_job(src, n), Path(tmp) / f"mpi-{n}", tags, timeout_s=600,
                           before_start=lambda _cluster, at_up=at_up: at_up.append(meter.seconds()))
            cpu_ours = None if at_up[0] is None else meter.seconds() - at_up[0]
            mpi.check(f"mpi on {n} hosts")
            ours = mpi.last_exit - mpi.hosts_up
            prepared = NamespaceCluster(hosts(n), Path(tmp) / f"prepared-{n}")
            try:
                prepared.start()
                mpirun = prepare(prepared, src)
                before = meter.seconds()
                bare_s = bare_retried(prepared, mpirun)
                cpu_bare = None if before is None else meter.seconds() - before
            finally:
                prepared.close()
                left += prepared.leftovers()
            rows.append((n, barrier, verdict, ours, bare_s, cpu_ours, cpu_bare))
            print(f"N={n:3d}: start to barrier {barrier:6.2f} s, barrier to verdict {verdict:5.2f} s; "
                  f"MPI job ours {ours:6.2f} s, bare {bare_s:6.2f} s, ours - bare {ours - bare_s:5.2f} s "
                  f"({(ours - bare_s) / n * 1000:4.0f} ms per host); CPU per host ours {cpu(cpu_ours, n)}, "
                  f"bare {cpu(cpu_bare, n)}", flush=True)


if __name__ == "__main__":
    main()
