"""What the accept() shim (native/netshim.c) costs: an MPI job with and without it, and its two costs alone.

1. job wall time of the same mpi4py allreduce on local hosts (1 process per host), ``run_local``
   from the call to the last host's exit, with ``TRAINING_TOOLKIT_NETSHIM`` on and off, rounds
   interleaved (on, off, on, ...) so that a slow moment hits both alike.
2. a program's start with the library preloaded (``/bin/true``), against without.
3. one accepted connection over loopback (connect, accept, close; the shim admits loopback
   after one comparison) and one from a job's host (a namespace host listed in the variable:
   the comparisons a real host's connection costs), each with and without the shim.

Needs root, Open MPI, openssh-server and mpi4py in the toolkit's venv.
Usage: .venv/bin/python bench/netshim.py [ROUNDS] [HOSTS]      (defaults 6, 2)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON, LocalRun

from training_toolkit import native
from training_toolkit.local.launcher import LocalJob
from training_toolkit.local.netns import NamespaceCluster, leftovers

ALLREDUCE = """\
from mpi4py import MPI
comm = MPI.COMM_WORLD
assert comm.allreduce(comm.Get_rank() + 1) == comm.Get_size() * (comm.Get_size() + 1) // 2
"""

# Listens at ADDRESS:PORT, says "up", accepts N connections one by one; prints the seconds per connection
ACCEPTS = r"""
import socket, sys, time
where, n = (sys.argv[1], int(sys.argv[2])), int(sys.argv[3])
server = socket.create_server(where, backlog=128)
print("up", flush=True)
conn, _ = server.accept()
conn.close()
t0 = time.perf_counter()
for _ in range(n - 1):
    server.accept()[0].close()
print((time.perf_counter() - t0) / (n - 1))
"""
CONNECTS = """import socket, sys
for _ in range(int(sys.argv[3])):
    socket.create_connection((sys.argv[1], int(sys.argv[2]))).close()
"""


def job(src: Path, hosts: tuple[str, ...], shim: str) -> LocalJob:
    hps = {"sagemaker_program": json.dumps("allreduce.py"), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "1"}
    return LocalJob(hosts=hosts, hyperparameters=hps, env={"TRAINING_TOOLKIT_NETSHIM": shim})


def stats(samples: list[float], unit: float = 1.0, fmt: str = "6.2f", suffix: str = "s") -> str:
    scaled = [s * unit for s in samples]
    return (f"median {statistics.median(scaled):{fmt}} {suffix}  (min {min(scaled):{fmt}}, "
            f"max {max(scaled):{fmt}})")


def start_cost(rounds: int, preload: str) -> tuple[list[float], list[float]]:
    bare, shimmed = [], []
    for _ in range(rounds):
        for env, into in (({}, bare), ({"LD_PRELOAD": preload, "TRAINING_TOOLKIT_NETSHIM_ALLOW": "10.0.0.2"}, shimmed)):
            t0 = time.perf_counter()
            subprocess.run(["/bin/true"], env={"PATH": "/usr/bin:/bin", **env}, check=True)
            into.append(time.perf_counter() - t0)
    return bare, shimmed


def accept_cost(rounds: int, preload: str, tmp: Path) -> dict[str, list[float]]:
    """Seconds per accepted connection: loopback and a job host's, with and without the shim (64 addresses)."""
    samples: dict[str, list[float]] = {key: [] for key in ("lo bare", "lo shim", "host bare", "host shim")}
    path = {"PATH": os.environ["PATH"]}
    with NamespaceCluster(["a", "b"], tmp / "accepts") as cluster:
        a, b = cluster.host("a").address, cluster.host("b").address
        shim_env = {"LD_PRELOAD": preload,
                    "TRAINING_TOOLKIT_NETSHIM_ALLOW": ",".join([*(f"10.9.{i}.1" for i in range(63)), b])}
        for i in range(rounds):
            for kind, env in (("bare", {}), ("shim", shim_env)) if i % 2 == 0 else (("shim", shim_env), ("bare", {})):
                for label, address, client in (("lo", "127.0.0.1", "a"), ("host", a, "b")):
                    port = str(7100 + i)
                    server = cluster.popen("a", [str(PYTHON), "-c", ACCEPTS, "0.0.0.0", port, "2000"],
                                           env={**path, **env}, stdout=subprocess.PIPE, text=True)
                    server.stdout.readline()
                    cluster.run(client, [str(PYTHON), "-c", CONNECTS, address, port, "2000"], env=path, timeout=120,
                                check=True)
                    samples[f"{label} {kind}"].append(float(server.communicate(timeout=60)[0]))
    return samples


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    hosts = tuple(f"algo-{i + 1}" for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2))
    preload = str(native.path_of(native.NETSHIM_LIBRARY))
    tags: list[str] = []
    walls: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="bench-netshim-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "allreduce.py").write_text(ALLREDUCE)
        for i in range(rounds):
            for shim in ("on", "off") if i % 2 == 0 else ("off", "on"):
                run = LocalRun(job(src, hosts, shim), Path(tmp) / f"{shim}-{i}", tags, timeout_s=120)
                run.check(f"shim {shim}")
                walls[shim].append(run.last_exit - run.started)
            print(f"round {i + 1}/{rounds}: shim on {walls['on'][-1]:.2f} s, off {walls['off'][-1]:.2f} s", flush=True)
        bare_start, shim_start = start_cost(200, preload)
        accepts = accept_cost(6, preload, Path(tmp))
    left = [item for tag in tags for item in leftovers(tag)]
    diff = [a - b for a, b in zip(walls["on"], walls["off"])]
    print(f"MPI job (allreduce) on {len(hosts)} local hosts x 1 process, {rounds} interleaved rounds "
          f"(a shared machine: noise of tenths of a second):")
    print(f"  shim on (default)            {stats(walls['on'])}")
    print(f"  shim off                     {stats(walls['off'])}")
    print(f"  on - off, per round          {stats(diff)}")
    print("the library alone:")
    print(f"  /bin/true                    {stats(bare_start, 1e3, '6.3f', 'ms')}")
    print(f"  /bin/true, shim preloaded    {stats(shim_start, 1e3, '6.3f', 'ms')}")
    for key, samples in accepts.items():
        print(f"  accept, {key:<20} {stats(samples, 1e6, '6.1f', 'us')}  per connection (2000 a round)")
    if left:
        raise SystemExit(f"left behind: {left}")
    print("  nothing left running (namespaces, processes, mounts)")


if __name__ == "__main__":
    main()
