"""Open MPI's daemons launched as a tree over the job's ssh (tree spawn), seen from outside the job; and no tree at the
default radix below 66 hosts.

4 hosts x 1 rank with ``routed_radix 2`` (Open MPI 4's routing tree, which tree spawn follows: with its
default radix of 64, every daemon of a job under 66 hosts is mpirun's own child and no tree forms).
Daemon vpids 1 and 2 (algo-2, algo-3) are mpirun's children, vpid 3 (algo-4) is vpid 1's: mpirun logs
in to algo-2 and algo-3, and algo-2's orted to algo-4 with algo-2's own client key.

While the ranks wait, the test reads every worker's orted below its ``train`` (``/proc``): the
``SSH_CONNECTION`` its sshd session gave it names the client's address and the host's own.  algo-4's
client is algo-2, not the first host; and an ``ssh`` to algo-4 runs below algo-2's train.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.keys import mount_keys
from helpers.multihost import hps, rank_files, run
from helpers.paths import OMPI5_BIN, TOOLKIT_PYTHON
from helpers.procenv import environ_value
from training_toolkit.supervise import procfs
from training_toolkit.cluster.ssh.keys import generate_keypair
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")

WAIT = """\
import json, os, socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
total = comm.allreduce(rank + 1)
model = os.environ["SM_MODEL_DIR"]
with open(os.path.join(model, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "sum": total, "hostname": socket.gethostname()}, f)
end = time.monotonic() + 60
while not os.path.exists(os.path.join(model, "release")) and time.monotonic() < end:
    time.sleep(0.05)
comm.Barrier()
"""


def sessions(train_pid: int, daemon: str) -> list[tuple[str, str, str]]:
    """(program, SSH_CONNECTION, command line) of each daemon and ssh below a host's train."""
    found = []
    for proc in procfs.descendants(train_pid):
        name = procfs.comm(proc.pid)
        if name in (daemon, "ssh"):
            found.append((name, environ_value(proc.pid, "SSH_CONNECTION") or "",
                          procfs.cmdline(proc.pid) or ""))
    return found


@pytest.mark.parametrize("mounted", [False, True], ids=["random-keys", "mounted-keys"])
def test_a_4_host_job_launches_its_daemons_as_a_tree(tmp_path, mounted):
    """With mounted keys (an MPIJob's secret: one pair on every host) each sshd admits that one key from every
    job host's address, on one line."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "wait.py").write_text(WAIT)
    env = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"}
    if mounted:
        keys = mount_keys(tmp_path / "keys", generate_keypair("client"), generate_keypair("host"))
        env["TRAINING_TOOLKIT_SSH_KEYS"] = str(keys)
    job = LocalJob(hosts=HOSTS, env=env,
                   hyperparameters=hps("wait.py", src, sagemaker_mpi_enabled=True,
                                       sagemaker_mpi_num_of_processes_per_host=1,
                                       sagemaker_mpi_custom_mpi_options="--mca routed_radix 2"))
    check_tree(job, tmp_path, "orted")


def test_at_open_mpis_default_radix_a_small_job_is_launched_by_mpirun_alone(tmp_path):
    """routed_radix 64: daemons 1-64 are mpirun's children, so below 66 hosts tree spawn is no tree (docs/scale.md)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "wait.py").write_text(WAIT)
    job = LocalJob(hosts=HOSTS, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"},
                   hyperparameters=hps("wait.py", src, sagemaker_mpi_enabled=True,
                                       sagemaker_mpi_num_of_processes_per_host=1))
    check_tree(job, tmp_path, "orted", tree=False)


def check_tree(job: LocalJob, tmp_path: Path, daemon: str, tree: bool = True) -> None:
    work = tmp_path / "cluster"
    seen: dict[str, list] = {}

    def look(procs):
        models = [work / host / "opt/ml/model" for host in HOSTS]
        deadline = time.monotonic() + 90
        try:
            while not all((m / f"rank-{i}.json").exists() for i, m in enumerate(models)):
                assert time.monotonic() < deadline, "the ranks never started"
                time.sleep(0.1)
            for host in HOSTS:
                seen[host] = sessions(procs[host].command_pid, daemon)
        finally:
            for m in models:
                (m / "release").touch()

    results = run(job, tmp_path, timeout_s=180, on_start=look)
    assert [r.exit_code for r in results] == [0, 0, 0, 0], [r.failure for r in results]
    assert {info["sum"] for info in rank_files(results).values()} == {10}

    # one session per host (PRRTE's prted runs as two processes of that session)
    orted = {host: sorted({conn for name, conn, _ in seen[host] if name == daemon}) for host in HOSTS[1:]}
    assert all(len(found) == 1 and found[0] for found in orted.values()), seen
    client = {host: found[0].split()[0] for host, found in orted.items()}  # who logged in to it
    own = {host: found[0].split()[2] for host, found in orted.items()}  # its own address, as its sshd saw it
    first = client["algo-2"]
    assert first not in own.values()  # mpirun, on the first host, started algo-2's daemon ...
    if not tree:
        assert client == {host: first for host in HOSTS[1:]}, (client, own)  # ... and every other one
        assert not [line for host in HOSTS[1:] for name, _, line in seen[host] if name == "ssh"]
        return
    assert client["algo-3"] == first  # ... and algo-3's
    assert client["algo-4"] == own["algo-2"], (client, own)  # algo-2's daemon started algo-4's: a tree
    # below algo-2's train: its orted's ssh to algo-4 (the agent execs ssh -F <algo-2's own config>)
    ssh_from_2 = [line for name, _, line in seen["algo-2"] if name == "ssh"]
    assert any("algo-4" in line.split() and "-F" in line.split() for line in ssh_from_2), seen["algo-2"]
    assert not [line for name, _, line in seen["algo-3"] + seen["algo-4"] if name == "ssh"]  # leaves: none
    # the first host logged in to its children only (its ssh processes: the probe's shared connections aside)
    assert not any("algo-4" in line.split() for name, _, line in seen["algo-1"] if name == "ssh"
                   and "-N" not in line.split())


WAIT5 = f"""#!{TOOLKIT_PYTHON}
import json, os, socket, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
model = os.environ["SM_MODEL_DIR"]
with open(os.path.join(model, f"rank-{{rank}}.json"), "w") as f:
    json.dump({{"rank": rank, "sum": 10, "hostname": socket.gethostname()}}, f)
end = time.monotonic() + 60
while not os.path.exists(os.path.join(model, "release")) and time.monotonic() < end:
    time.sleep(0.05)
"""


@pytest.mark.openmpi5
def test_under_open_mpi_5_too(tmp_path):
    """PRRTE's tree spawn (plm_ssh_no_tree_spawn unset) follows its own routed_radix: the same tree, of prteds."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "wait").write_text(WAIT5)
    (src / "wait").chmod(0o755)
    job = LocalJob(hosts=HOSTS, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60",
                                     "PATH": f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"},
                   hyperparameters=hps("wait", src, sagemaker_mpi_enabled=True,
                                       sagemaker_mpi_num_of_processes_per_host=1,
                                       sagemaker_mpi_custom_mpi_options="--prtemca routed_radix 2"))
    check_tree(job, tmp_path, "prted")
