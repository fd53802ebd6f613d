"""Slurm as its users run it: an ordinary user (not root), made for the test, submits and runs an MPI job.

The user submits with ``sbatch`` itself (``setpriv`` to its uid: munge vouches for that uid, so slurmd
runs the job as that user, as on a real cluster); the job's own sshd listens on 2222 (an ordinary
user cannot bind below 1024).  The namespace nodes share the machine's ``/tmp``, as nodes with a
shared ``/tmp`` do, and ``/run`` is root's: every runtime file of the toolkit must land where this
user may write, at a path no other node of the job uses (docs/slurm.md).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.multihost import source_dir
from helpers.slurm import slurm_cluster
from integration.platforms.test_slurm import batch_script, jobcomp, model_dir, mpi_env, settled, verdict

pytestmark = [pytest.mark.slurm, pytest.mark.root]


@pytest.fixture
def ordinary_user():
    """A user made for this test (bash its shell, a throwaway home with a .bashrc that exits 1), and a directory of its own."""
    name = f"tt{os.getpid() % 100000}x{os.urandom(2).hex()}"
    base = Path(tempfile.mkdtemp(prefix="tt-slurm-user-"))
    home = base / "home"
    home.mkdir()
    # a .bashrc that would end every ssh session's shell: the job's launch must not read it (docs/multihost.md)
    (home / ".bashrc").write_text("echo read >> ~/bashrc-ran\nexit 1\n")
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--user-group",
                    name], check=True, capture_output=True, timeout=30)
    try:
        user = pwd.getpwnam(name)
        chown_tree(home, user)
        base.chmod(0o755)
        yield user, base
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def chown_tree(path: Path, user) -> None:
    for root, dirs, files in os.walk(path):
        for entry in (root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)):
            os.chown(entry, user.pw_uid, user.pw_gid)


def submit_as(slurm, user, script: Path, timeout: float = 240):
    """sbatch run by ``user`` itself, then its completion record: (exit code, job id, the job's output)."""
    argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
            "sbatch", "--parsable", str(script)]
    result = slurm.run(argv, timeout=60, env={"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name},
                       cwd=str(script.parent))
    job = result.stdout.split(";")[0].strip()
    assert job.isdigit(), (result.stdout, result.stderr)
    code = int(jobcomp(slurm, job, timeout)["ExitCode"].split(":")[0])
    out = script.parent / f"slurm-{job}.out"
    return code, job, out.read_text(errors="replace") if out.exists() else ""


@pytest.mark.mpi
@pytest.mark.sshd
@pytest.mark.parametrize("tmpdir", [False, True], ids=["tmp", "shared-TMPDIR"])
def test_mpi_2_nodes_x_2_ranks_as_an_ordinary_user(ordinary_user, tmpdir):
    """Both nodes write their ranks' file, sshd's files and stall watch under the one /tmp, or one TMPDIR."""
    user, base = ordinary_user
    work = base / "job"
    work.mkdir()
    shared = base / "scratch"  # a TMPDIR on storage every node sees, as a cluster's shared scratch is
    shared.mkdir()
    src = source_dir(work, "mpi_allreduce.py")
    env = {"TRAINING_TOOLKIT_SSH_PORT": "2222", "TRAINING_TOOLKIT_STALL_TIMEOUT": "60",
           **({"TMPDIR": str(shared)} if tmpdir else {})}
    with slurm_cluster(base) as slurm:
        for host in slurm.names:
            chown_tree(slurm.cluster.host(host).opt_ml, user)
        script = batch_script(work, 2, mpi_env(src, **env))
        for tree in (work, shared):
            chown_tree(tree, user)
        code, job, out = submit_as(slurm, user, script)
        assert code == 0, out
        assert [verdict(slurm, h)[0] for h in ("node1", "node2")] == ["success", "success"], out
        ranks = {}
        for host in ("node1", "node2"):
            for f in model_dir(slurm, host).glob("rank-*.json"):
                assert f.stat().st_uid == user.pw_uid, f"{f} was not written by the user"
                info = json.loads(f.read_text())
                ranks[info["rank"]] = info
        assert jobcomp(slurm, job)["JobState"] == "COMPLETED"
        assert settled(slurm) == {}
    assert sorted(ranks) == [0, 1, 2, 3] and {r["sum"] for r in ranks.values()} == {10}
    assert [ranks[i]["hostname"] for i in range(4)] == ["node1", "node1", "node2", "node2"]
    assert all(r["sm_current_host"] == r["hostname"] for r in ranks.values())
    assert not (Path(user.pw_dir) / "bashrc-ran").exists(), "the user's .bashrc was read"
    # nothing of the job's runtime files is left where both nodes wrote them
    left = [p for d in (Path("/tmp"), shared) for p in d.glob("training-toolkit-*") if p.stat().st_uid == user.pw_uid]
    assert left == [], left
