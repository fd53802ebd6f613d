"""Slurm as its users run it: an ordinary user (not root), made for the test, submits and runs an MPI job.

The user submits with ``sbatch`` itself (``setpriv`` to its uid: munge vouches for that uid, so slurmd
runs the job as that user, as on a real cluster); the job's own sshd listens on 2222 (an ordinary
user cannot bind below 1024).  The namespace nodes share the machine's ``/tmp``, as nodes with a
shared ``/tmp`` do, and ``/run`` is root's: every runtime file of the toolkit must land where this
user may write, at a path no other node of the job uses (docs/slurm.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.multihost import source_dir
from helpers.slurm import chown_tree, ordinary_user, runtime_files, slurm_cluster
from integration.platforms.test_slurm import batch_script, jobcomp, model_dir, mpi_env, settled, submit, verdict

pytestmark = [pytest.mark.slurm, pytest.mark.root]


@pytest.mark.mpi
@pytest.mark.sshd
@pytest.mark.parametrize("tmpdir", [False, True], ids=["tmp", "shared-TMPDIR"])
def test_mpi_2_nodes_x_2_ranks_as_an_ordinary_user(tmpdir):
    """Both nodes write their ranks' file, sshd's files and stall watch under the one /tmp, or one TMPDIR."""
    with ordinary_user() as (user, base):
        run_as(user, base, tmpdir)


def run_as(user, base: Path, tmpdir: bool) -> None:
    work = base / "job"
    work.mkdir()
    shared = base / "scratch"  # a TMPDIR on storage every node sees, as a cluster's shared scratch is
    shared.mkdir()
    src = source_dir(work, "mpi_allreduce.py")
    env = {"TRAINING_TOOLKIT_SSH_PORT": "2222", "TRAINING_TOOLKIT_STALL_TIMEOUT": "60",
           **({"TMPDIR": str(shared)} if tmpdir else {})}
    chown_tree(base, user)  # the cluster's own files, made below, stay root's
    with slurm_cluster(base) as slurm:
        assert slurm.user == user
        script = batch_script(work, 2, mpi_env(src, **env))
        chown_tree(shared, user)
        code, job, out = submit(slurm, script)
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
    left = [p for d in (Path("/tmp"), shared) for p in runtime_files(user, d)]
    assert left == [], left
