"""`training-toolkit local --image` against bare mpirun in the same image, and start to barrier in containers.

Two figures, from runs interleaved round by round, through the engine DOCKER_HOST names and the image $TT_IMAGE:

1. job wall time of the same mpi4py allreduce on 2 containers x 2 processes: ``run_containers``
   (what ``local --image`` runs) from the call to its return (network and containers created and
   started, the toolkit's join, keys and sshd, mpirun, teardown of every container and the network,
   artifacts), vs ``mpirun`` exec'ed in algo-1 of two containers of the same image that are already
   running, with sshd and the job's ssh files in place, with the options our runner passes.
   Target: ours <= bare + 1.5 s.  Each rank prints CLOCK_MONOTONIC when it starts and ends, so each
   run splits into: the call (or exec) to the first rank's start, the ranks, the last rank's end to
   the return; the medians of each, ours beside bare, say where the difference is.
2. containers started to every host past the barrier, 4 containers, one process each (the
   torch-style launcher: no framework import): from just before the first container's start to
   the moment the last host's script starts (each writes ``time.monotonic()`` first thing;
   CLOCK_MONOTONIC is the kernel's, the same in every container). Target: <= 2 s.

Usage: DOCKER_HOST=unix:///... TT_IMAGE=IMAGE .venv/bin/python bench/containers.py [ROUNDS]   (default 5)
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import STAMP, WAIT_FOR_SSH, WRITE_SSH_DIR, stamps

from training_toolkit.cluster.ssh.keys import generate_keypair
from training_toolkit.local import engine
from training_toolkit.local.container_launcher import run_containers
from training_toolkit.local.containers import CODE_DIR, LABEL_JOB, host_names
from training_toolkit.local.job import LocalJob

IMAGE = os.environ.get("TT_IMAGE", "localhost/training-toolkit:cpu")
PYTHON = "/opt/venv/bin/python"  # the image's venv
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}

ALLREDUCE = """\
import sys, time
sys.stdout.write(f"STAMP start {time.monotonic()}\\n")  # one write: mpirun tags each write on its own
from mpi4py import MPI
comm = MPI.COMM_WORLD
assert comm.allreduce(comm.Get_rank() + 1) == comm.Get_size() * (comm.Get_size() + 1) // 2
sys.stdout.write(f"STAMP end {time.monotonic()}\\n")
sys.stdout.flush()
"""
STAMP_LINE = re.compile(rb"STAMP (start|end) ([0-9.]+)")


def phases(output: bytes, t0: float, t1: float) -> tuple[float, float, float]:
    """(call to the first rank's start, first start to last end, last end to return): where a job's time went.

    Each rank prints CLOCK_MONOTONIC, the kernel's, the same in every container and here."""
    found = [(kind, float(value)) for kind, value in STAMP_LINE.findall(output)]
    starts = [t for kind, t in found if kind == b"start"]
    ends = [t for kind, t in found if kind == b"end"]
    if len(starts) != 4 or len(ends) != 4:
        raise SystemExit(f"expected 4 ranks' stamps, got {len(starts)} starts and {len(ends)} ends")
    return min(starts) - t0, max(ends) - min(starts), t1 - max(ends)
SSH_DIR = "/run/bench-ssh"

def mpi_job(hosts) -> LocalJob:
    return LocalJob(hosts=hosts, env=QUIET, hyperparameters={
        "sagemaker_program": json.dumps("allreduce.py"), "sagemaker_submit_directory": json.dumps(CODE_DIR),
        "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2"})


def ours(client, src: Path, workdir: Path) -> tuple[float, tuple[float, float, float], float]:
    out = io.BytesIO()
    t0 = time.monotonic()
    run = run_containers(mpi_job(host_names(2, secrets.token_hex(3))), workdir, environ=os.environ, image=IMAGE, source=src, out=out,
                         client=client, timeout_s=300)
    t1 = time.monotonic()
    if [r.exit_code for r in run.results] != [0, 0] or run.leftovers:
        sys.stdout.buffer.write(out.getvalue())
        raise SystemExit(f"ours: exit codes {[r.exit_code for r in run.results]}, left {run.leftovers}")
    return t1 - t0, phases(out.getvalue(), t0, t1), run.starting_at - t0  # the last: network and containers created


class Prepared:
    """Two running containers of the image (``sleep infinity``), sshd and the job's ssh files in place."""

    def __init__(self, client, src: Path, keys_dir: Path):
        self.client, self.id = client, "tt-bench-" + secrets.token_hex(3)
        self.hosts = host_names(2, secrets.token_hex(3))
        labels = {LABEL_JOB: self.id}
        client.networks.create(self.id, driver="bridge", labels=labels)
        mounts = [{"Type": "bind", "Source": str(src), "Target": CODE_DIR, "ReadOnly": True},
                  {"Type": "bind", "Source": str(keys_dir), "Target": "/keys", "ReadOnly": True}]
        self.containers = [client.containers.run(IMAGE, name=h, hostname=h, entrypoint=["sleep", "infinity"],
                                                 network=self.id, labels=labels, mounts=mounts, detach=True,
                                                 shm_size="1g", environment=QUIET) for h in self.hosts]
        for c in self.containers:
            c.reload()
        addresses = [c.attrs["NetworkSettings"]["Networks"][self.id]["IPAddress"] for c in self.containers]
        client_key, host_key = generate_keypair("bench-client"), generate_keypair("bench-host")
        (keys_dir / "keys.json").write_text(json.dumps({"client": [client_key.private.decode(), client_key.public],
                                                        "host": [host_key.private.decode(), host_key.public]}))
        self._exec(0, [PYTHON, "-c", WRITE_SSH_DIR, "/keys/keys.json", SSH_DIR, "client", self.hosts[1]])
        self._exec(1, [PYTHON, "-c", WRITE_SSH_DIR, "/keys/keys.json", SSH_DIR, "server", *addresses])
        self._exec(1, ["sh", "-c", f"mkdir -p /run/sshd && /usr/sbin/sshd -f {SSH_DIR}/sshd_config"])
        self._exec(0, [PYTHON, "-c", WAIT_FOR_SSH, SSH_DIR, self.hosts[1]])
        # The options our runner passes (runners/mpi_command.py, Open MPI 4) without its -x list and rank wrapper.
        self.mpirun = ["mpirun", "--allow-run-as-root", "--host", ",".join(f"{h}:2" for h in self.hosts), "-np", "4",
                       "--tag-output", "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                       "--mca", "plm_rsh_agent", f"ssh -F {SSH_DIR}/ssh_config", "--mca", "plm_rsh_no_tree_spawn", "1",
                       "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "^openib",
                       "--mca", "orte_abort_on_non_zero_status", "1", PYTHON, f"{CODE_DIR}/allreduce.py"]

    def _exec(self, index: int, argv: list[str]) -> bytes:
        code, output = self.containers[index].exec_run(argv)
        if code != 0:
            raise SystemExit(f"prepare {self.hosts[index]}: {argv[:3]} exited {code}: {output.decode(errors='replace')}")
        return output

    def bare(self) -> tuple[float, tuple[float, float, float]]:
        t0 = time.monotonic()
        output = self._exec(0, self.mpirun)
        t1 = time.monotonic()
        return t1 - t0, phases(output, t0, t1)

    def close(self) -> list[str]:
        return engine.remove_job(self.client, self.id)


def barrier(client, src: Path, workdir: Path) -> float:
    job = LocalJob(hosts=host_names(4, secrets.token_hex(3)), env=QUIET, hyperparameters={
        "sagemaker_program": json.dumps("stamp.py"), "sagemaker_submit_directory": json.dumps(CODE_DIR),
        "sagemaker_torch_distributed_enabled": "true"})
    out = io.BytesIO()
    run = run_containers(job, workdir, environ=os.environ, image=IMAGE, source=src, out=out, client=client, timeout_s=300)
    if [r.exit_code for r in run.results] != [0] * 4 or run.leftovers:
        sys.stdout.buffer.write(out.getvalue())
        raise SystemExit(f"barrier job: exit codes {[r.exit_code for r in run.results]}, left {run.leftovers}")
    return max(stamps(run.results)) - run.starting_at


def stats(samples: list[float]) -> str:
    return f"median {statistics.median(samples):6.2f} s  (min {min(samples):.2f}, max {max(samples):.2f})"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    client = engine.connect(engine.socket_url(os.environ))
    engine.check_image(client, IMAGE, engine.socket_url(os.environ))
    wall_ours, wall_bare, barriers = [], [], []
    parts_ours: list[tuple[float, float, float]] = []
    parts_bare: list[tuple[float, float, float]] = []
    created: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp:
        src, keys = Path(tmp) / "src", Path(tmp) / "keys"
        src.mkdir()
        keys.mkdir(mode=0o700)
        (src / "allreduce.py").write_text(ALLREDUCE)
        (src / "stamp.py").write_text(STAMP)
        prepared = Prepared(client, src, keys)
        try:
            prepared.bare()  # warm-up: the first exec pays for page cache
            for i in range(rounds):
                mine = ours(client, src, Path(tmp) / f"ours-{i}")
                created.append(mine[2])
                for walls, parts, result in ((wall_ours, parts_ours, mine), (wall_bare, parts_bare, prepared.bare())):
                    walls.append(result[0])
                    parts.append(result[1])
                barriers.append(barrier(client, src, Path(tmp) / f"barrier-{i}"))
                print(f"round {i + 1}/{rounds}: mpi 2x2 ours {wall_ours[-1]:.2f} s, bare {wall_bare[-1]:.2f} s; "
                      f"4 containers started to barrier {barriers[-1]:.2f} s", flush=True)
        finally:
            problems = prepared.close()
    # Only what this benchmark made: others' jobs may share the engine's storage (another service, same podman).
    mine = {"label": f"{LABEL_JOB}={prepared.id}"}
    left = sorted(c.name for c in client.containers.list(all=True, filters=mine))
    left += sorted(n.name for n in client.networks.list(filters=mine))
    print(f"engine {client.version().get('Components', [{}])[0].get('Name', '?')} {client.version()['Version']}, "
          f"image {IMAGE}, {rounds} interleaved rounds:")
    print(f"  MPI 2 containers x 2 ranks, bare mpirun (prepared)   {stats(wall_bare)}")
    print(f"  MPI 2 containers x 2 ranks, local --image (whole)    {stats(wall_ours)}   "
          f"(+{statistics.median(wall_ours) - statistics.median(wall_bare):.2f} s over bare; target <= 1.5)")
    print(f"  4 containers: started to every host past the barrier {stats(barriers)}   (target <= 2)")
    print("  where the MPI job's time went, medians (ours / bare / ours - bare):")
    for k, name in enumerate(("call to the first rank's start", "first rank's start to the last one's end",
                              "last rank's end to return")):
        o, b = (statistics.median(p[k] for p in parts) for parts in (parts_ours, parts_bare))
        print(f"    {name:42s} {o:5.2f} s / {b:5.2f} s / {o - b:+5.2f} s")
    print(f"    of ours' first part, the network and containers created (before the first start): "
          f"{statistics.median(created):.2f} s")
    if problems or left:
        raise SystemExit(f"left behind: {problems + left}")
    print("  nothing left at the engine (containers, networks)")


if __name__ == "__main__":
    main()
