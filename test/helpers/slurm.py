"""A real Slurm cluster on local namespace hosts for a test, closed and checked for leftovers afterwards; and the
ordinary user every Slurm test also runs as (``as_root_and_user`` below).

Who submits is who owns the test's directory: ``slurm_cluster(tmp_path)`` on a directory of root's is root's
cluster as before; on one of an ordinary user's (``as_root_and_user``'s ``user`` case), every host's job
directory is made that user's and ``submit`` runs ``sbatch`` as that user (docs/slurm.md, "As an ordinary user").
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from training_toolkit.local.slurm import SlurmCluster

#: The SLURM_* environment slurmstepd gave task 1 of ``srun -N2 --ntasks-per-node=1`` in an ``sbatch -N2`` job
#: on the local Slurm 22.05 cluster (the unit tests' input; an integration test compares it with a live srun).
TASK = {
    "SLURMD_NODENAME": "node2", "SLURM_CLUSTER_NAME": "toolkit", "SLURM_CPUS_ON_NODE": "1", "SLURM_GTIDS": "1",
    "SLURM_JOBID": "1", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LAUNCH_NODE_IPADDR": "192.0.2.11", "SLURM_LOCALID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
    "SLURM_NODELIST": "node[1-2]", "SLURM_NPROCS": "2", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "1", "SLURM_STEPID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_SUBMIT_DIR": "/tmp", "SLURM_SUBMIT_HOST": "node1", "SLURM_TASKS_PER_NODE": "1(x2)",
}

#: Tags of this run's clusters start with it, so no check mistakes another run's cluster for ours.
RUN_PREFIX = f"tts{os.getpid() % 100000}"


@contextmanager
def slurm_cluster(tmp_path: Path, nodes: int = 2, head: bool = False, **kw) -> Iterator[SlurmCluster]:
    """Nodes ``node1..nodeN``; on the way out: nothing of the cluster left (no process, namespace, key).

    ``head``: the controller runs on a host ``head`` that is no node (jobs are submitted there), so that any node,
    the batch host included, can die without it.
    ``slurm.user`` is the owner of ``tmp_path`` when that is not root (its jobs are submitted as it), else None.
    """
    names = [f"node{i}" for i in range(1, nodes + 1)]
    slurm = SlurmCluster(names, tmp_path / "slurm", tag=f"{RUN_PREFIX}-{os.urandom(2).hex()}",
                         head="head" if head else None, **kw)
    owner = tmp_path.stat().st_uid if tmp_path.exists() else 0  # a directory the cluster makes is root's
    with slurm:
        slurm.baseline = {pid for pids in slurm.cluster.pids().values() for pid in pids}  # the daemons, idle
        slurm.user = pwd.getpwuid(owner) if owner != 0 else None
        if slurm.user is not None:
            for host in slurm.names:  # each node's /opt/ml: written by the job, so the user's
                chown_tree(slurm.cluster.host(host).opt_ml, slurm.user)
        yield slurm
    left = slurm.leftovers()
    assert not left, f"left behind by the Slurm cluster: {left}"


def chown_tree(path: Path, user, skip: Path | None = None) -> None:
    """``path`` and everything below it made ``user``'s, but ``skip`` and what is below it (the cluster's own)."""
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if skip is None or Path(root, d) != skip]
        for entry in (root, *(os.path.join(root, f) for f in files)):
            os.chown(entry, user.pw_uid, user.pw_gid)


def submit_argv(slurm: SlurmCluster, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """A client command as the cluster's user (``setpriv`` to its uid: munge vouches for that uid, so slurmd runs the
    job as it, as on a real cluster; not ``sbatch --uid``, root's way of submitting for someone), and its environment."""
    user = getattr(slurm, "user", None)
    if user is None:
        return argv, {}
    return (["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", *argv],
            {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name})


@contextmanager
def ordinary_user() -> Iterator[tuple[pwd.struct_passwd, Path]]:
    """A user made for one test (bash its shell, a throwaway home whose .bashrc exits 1), and a directory (0755) to
    work in; both removed afterwards.  A read .bashrc writes ``~/bashrc-ran`` first: the job's launch must not read
    it (docs/multihost.md)."""
    name = f"tt{os.getpid() % 100000}x{os.urandom(2).hex()}"
    base = Path(tempfile.mkdtemp(prefix="tt-slurm-user-"))
    home = base / "home"
    home.mkdir()
    (home / ".bashrc").write_text("echo read >> ~/bashrc-ran\nexit 1\n")
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--user-group",
                    name], check=True, capture_output=True, timeout=30)
    user = None
    try:
        user = pwd.getpwnam(name)
        remove_runtime_files(user)  # an earlier user's of the same uid (userdel leaves /tmp): not this test's
        chown_tree(home, user)
        base.chmod(0o755)
        yield user, base
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)
        if user is not None:
            remove_runtime_files(user)  # checked by the test already; the next user of this uid starts clean
        shutil.rmtree(base, ignore_errors=True)


def runtime_files(user, directory: Path = Path("/tmp")) -> list[Path]:
    """The toolkit's runtime files and directories of ``user`` in ``directory`` (what a job must not leave)."""
    return sorted(p for p in directory.glob("training-toolkit-*") if owned_by(p, user))


def remove_runtime_files(user) -> None:
    for path in runtime_files(user):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


@pytest.fixture(name="tmp_path", params=["root", "user"])
def as_root_and_user(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """``tmp_path`` for every Slurm test, which then runs twice (import this fixture into the module): as root, in pytest's own directory, and as an
    ordinary user made for it, in a directory of that user's (pytest's is root's alone, 0700)."""
    if request.param == "root":
        yield tmp_path
        return
    with ordinary_user() as (user, base):
        work = base / "work"
        work.mkdir()
        os.chown(work, user.pw_uid, user.pw_gid)
        yield work
        assert not (Path(user.pw_dir) / "bashrc-ran").exists(), "the user's .bashrc was read"
        left = [str(p) for p in runtime_files(user)]
        assert left == [], f"the user's runtime files left in /tmp: {left}"


def owned_by(path: Path, user) -> bool:
    try:
        return path.lstat().st_uid == user.pw_uid
    except OSError:
        return False
