"""Every MPI rank's world, ours against the reference's, on 2 hosts x 2 ranks whose kernel host name is ``aws``.

The same job (custom MPI options included) runs twice on local namespace hosts: once
under the reference ``sagemaker-training`` 5.1.4 (``.venv-ref``), once under ours.  Each
rank dumps its whole environment, argv, cwd and ``gethostname()``; they are compared rank
by rank.  What differs, differs as docs/contract.md's table says (``DIFFERENCES`` below
names each, with its row), and nothing else does.

The reference needs what a SageMaker container gives it: sshd on port 22 with the
machine's host keys, a key pair in ``~/.ssh`` that every host accepts, ssh configured
not to check host keys, a writable ``/etc/environment`` (its workers append their
environment there for the ranks' ssh sessions) and a ``/tmp`` of each host's own (its
first host ``touch``es a status file there on the others).  Each host gets them as
bind mounts inside its own mount namespace; the machine's files are never touched.
The reference's end takes ~30 s of its fixed sleeps on each host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import reference
from helpers.multihost import ours_running
from helpers.paths import TOOLKIT_PYTHON
from training_toolkit import native
from training_toolkit.local.launcher import LocalJob, run_local

pytestmark = [pytest.mark.reference, pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

HOSTS = ("algo-1", "algo-2")
PER_HOST = 2
CUSTOM = "--NCCL_DEBUG=WARN -x MY_VAR=on"
USER_ARGS = {"lr": "0.1", "msg": '"a b; \'c\'"'}

# The ranks stay 3 s: the reference's workers look for an orted process once a second, and one that came and
# went between two looks leaves them waiting 20 minutes for it (a defect of the reference, docs/contract.md).
DUMP = f"""#!{TOOLKIT_PYTHON}
import json, os, socket, sys, time
rank = os.environ["OMPI_COMM_WORLD_RANK"]
with open(f"/opt/ml/model/rank-{{rank}}.json", "w") as f:
    json.dump({{"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(), "hostname": socket.gethostname()}}, f)
time.sleep(3)
"""

# Open MPI's own variables: each run's ids, ports and session paths, and each mpirun line's MCA parameters.
RUNTIME_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_", "ORTE_")
RUNTIME_NAMES = {"HFI_NO_BACKTRACE", "IPATH_NO_BACKTRACE"}
# What an ssh session adds to a remote rank of the reference (sshd, PAM, login): our ranks keep none of it.
SESSION_NAMES = {"SSH_CLIENT", "SSH_CONNECTION", "USER", "LOGNAME", "MAIL", "SHELL", "MOTD_SHOWN", "SHLVL", "OLDPWD", "_"}
# Ours only (docs/contract.md, "added variables"), and the platform's job secret, which ours removes ("job secret").
OURS_ONLY = {"TRAINING_TOOLKIT_RANK_TAG", "TRAINING_TOOLKIT_SUPERVISOR", "SAGEMAKER_PROGRAM", "TRAINING_TOOLKIT_JOB_SECRET",
             "TRAINING_TOOLKIT_RESTART_COUNT", "TRAINING_TOOLKIT_NETSHIM_ALLOW", "TRAINING_TOOLKIT_NETSHIM_PORTS",
             "TRAINING_TOOLKIT_RANK_STOP_FLAG", "TRAINING_TOOLKIT_RANK_RESTART_FLAG", "TRAINING_TOOLKIT_RANK_STOP_WAIT_MS",
             "TRAINING_TOOLKIT_RANK_PID", "TRAINING_TOOLKIT_RANK_PARENT", "TRAINING_TOOLKIT_HEARTBEAT_DIR",
             "TRAINING_TOOLKIT_RANKS_DIR"}
# The first host's values that the reference forwards to every rank (docs/contract.md, "MPI ranks"): ours are each host's.
HOST_SPECIFIC = {"SM_CURRENT_HOST", "SM_RESOURCE_CONFIG", "SM_TRAINING_ENV"}


def write_ssh_home(root: Path) -> None:
    """What a SageMaker image gives the reference: one key every host accepts, no host-key checks."""
    ssh_dir = root / ".ssh"
    ssh_dir.mkdir(parents=True, mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_dir / "id_ed25519")], check=True,
                   timeout=30)
    (ssh_dir / "authorized_keys").write_bytes((ssh_dir / "id_ed25519.pub").read_bytes())
    (ssh_dir / "config").write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    for f in ssh_dir.iterdir():
        f.chmod(0o600)


def mount_for_reference(cluster, scratch: Path, ssh_home: Path) -> None:
    for host in cluster.hosts:
        own = scratch / host.name
        (own / "tmp").mkdir(parents=True)
        (own / "tmp").chmod(0o1777)
        (own / "environment").write_text("")
        # /tmp last: the sources live under the machine's /tmp
        for source, target in ((ssh_home, "/root"), (own / "environment", "/etc/environment"), (own / "tmp", "/tmp")):
            cluster.run(host, ["mount", "--bind", str(source), target], timeout=10, check=True)


def hostnames_aws(cluster) -> None:
    for host in cluster.hosts:
        cluster.run(host, ["/bin/sh", "-c", "printf aws > /proc/sys/kernel/hostname"], timeout=10, check=True)


def run_job(tmp_path: Path, name: str, train: list[str], extra_mounts=None) -> dict[int, dict]:
    hyper = {"sagemaker_program": json.dumps("dump_rank"), "sagemaker_mpi_enabled": "true",
             "sagemaker_mpi_num_of_processes_per_host": str(PER_HOST),
             "sagemaker_mpi_custom_mpi_options": json.dumps(CUSTOM), **USER_ARGS}
    job = LocalJob(hosts=HOSTS, hyperparameters=hyper, train=train,
                   env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "FROM_PLATFORM": "kept"})

    def before_start(cluster) -> None:
        for host in cluster.hosts:
            code = host.opt_ml / "code"
            code.mkdir(parents=True, exist_ok=True)
            (code / "dump_rank").write_text(DUMP)
            (code / "dump_rank").chmod(0o755)
        hostnames_aws(cluster)
        if extra_mounts:
            extra_mounts(cluster)

    results = run_local(job, tmp_path / name, environ=os.environ, timeout_s=240, out=sys.stdout.buffer, before_start=before_start)
    assert [r.exit_code for r in results] == [0] * len(HOSTS), [(r.exit_code, r.failure) for r in results]
    assert not ours_running(), ours_running()
    ranks = {}
    for r in results:
        for f in r.model_dir.glob("rank-*.json"):
            ranks[int(f.stem.split("-")[1])] = {**json.loads(f.read_text()), "host": r.host}
    assert sorted(ranks) == list(range(PER_HOST * len(HOSTS)))
    return ranks


def comparable(env: dict[str, str], host: str) -> dict[str, str]:
    """A rank's environment minus what docs/contract.md says differs, and why."""
    out = {k: v for k, v in env.items() if not k.startswith(RUNTIME_PREFIXES) and k not in RUNTIME_NAMES
           and k not in SESSION_NAMES | OURS_ONLY | HOST_SPECIFIC | reference.HARNESS_VARS | reference.MACHINE_DEPENDENT_VARS}
    out.pop("LD_PRELOAD", None)  # compared on its own below
    if "PYTHONPATH" in out:
        out["PYTHONPATH"] = out["PYTHONPATH"].split(":", 1)[0]  # the code dir; the rest is each toolkit's own sys.path
    return out


@pytest.mark.skipif(reference.reference_train() is None, reason=reference.SKIP_REASON)
def test_every_rank_of_2_hosts_x_2_sees_what_the_references_sees(tmp_path):
    ssh_home = tmp_path / "ssh-home"
    write_ssh_home(ssh_home)
    ref = run_job(tmp_path, "ref", [str(reference.reference_train())],
                  lambda cluster: mount_for_reference(cluster, tmp_path / "mounts", ssh_home))
    ours = run_job(tmp_path, "ours", [str(Path(sys.executable).with_name("train"))])
    for rank in sorted(ref):
        r, o = ref[rank], ours[rank]
        host = HOSTS[rank // PER_HOST]
        assert r["host"] == o["host"] == host
        assert r["hostname"] == o["hostname"] == host, rank  # both preload a gethostname() answering the rank's host
        assert r["cwd"] == o["cwd"] == "/opt/ml/code"
        assert r["argv"][1:] == o["argv"][1:] == ["--lr", "0.1", "--msg", "a b; 'c'"], rank
        assert (r["argv"][0], o["argv"][0]) == ("./dump_rank", "/opt/ml/code/dump_rank")  # sh -c vs exec
        ref_env, our_env = comparable(r["env"], host), comparable(o["env"], host)
        assert sorted(our_env) == sorted(ref_env), (rank, set(our_env) ^ set(ref_env))
        for key in ref_env:
            assert our_env[key] == ref_env[key], (rank, key, our_env[key], ref_env[key])
        assert (o["env"]["NCCL_DEBUG"], o["env"]["MY_VAR"]) == (r["env"]["NCCL_DEBUG"], r["env"]["MY_VAR"]) == ("WARN", "on")
        # LD_PRELOAD: each toolkit's own library; the reference replaces a user's, ours adds to it (no user's here)
        assert Path(r["env"]["LD_PRELOAD"]).name.startswith("gethostname")
        assert o["env"]["LD_PRELOAD"] == (f"{native.path_of(native.HOSTNAME_LIBRARY)}:{native.path_of(native.NETSHIM_LIBRARY)}:"
                                          f"{native.path_of(native.RANK_STOP_LIBRARY)}")
        # host-specific: the reference forwards the first host's; ours are the rank's own host's
        assert r["env"]["SM_CURRENT_HOST"] == "algo-1" and o["env"]["SM_CURRENT_HOST"] == host
        ref_training, our_training = json.loads(r["env"]["SM_TRAINING_ENV"]), json.loads(o["env"]["SM_TRAINING_ENV"])
        assert our_training["current_host"] == host and our_training["is_master"] == (host == HOSTS[0])
        assert our_training["resource_config"]["current_host"] == json.loads(o["env"]["SM_RESOURCE_CONFIG"])["current_host"] == host
        assert o["env"]["CURRENT_HOST"] == host  # the reference's too: its workers' ranks read their train's from /etc/environment
        for key in ("num_cpus", "num_gpus", "num_neurons", "current_host", "is_master", "resource_config"):
            ref_training.pop(key), our_training.pop(key)
        assert our_training == ref_training, rank
