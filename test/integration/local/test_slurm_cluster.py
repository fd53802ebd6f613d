"""The local Slurm cluster itself: real munged, slurmctld and slurmd on namespace hosts, and nothing left after."""

from __future__ import annotations

import pytest

from helpers.slurm import slurm_cluster
from training_toolkit.core.errors import ClusterError
from training_toolkit.local.slurm import SlurmCluster

pytestmark = [pytest.mark.slurm]


def test_srun_runs_one_task_on_each_node_named_as_its_host(tmp_path):
    with slurm_cluster(tmp_path) as slurm:
        result = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "hostname"], timeout=120)
        assert result.returncode == 0, result.stderr
        assert sorted(result.stdout.split()) == ["node1", "node2"]
        nodes = slurm.run(["scontrol", "show", "node", "node2"], timeout=60).stdout
        assert "NodeAddr=192.0.2.12 " in nodes and "State=" in nodes
    assert not (tmp_path / "slurm" / "munge" / "munge.key").exists()


def test_every_cluster_has_its_own_random_munge_key(tmp_path):
    keys = []
    for run in ("a", "b"):
        with slurm_cluster(tmp_path / run, nodes=1) as slurm:
            key = slurm.workdir / "munge" / "munge.key"
            assert key.stat().st_mode & 0o777 == 0o400
            keys.append(key.read_bytes())
    assert keys[0] != keys[1] and len(keys[0]) == 1024


def test_a_daemon_that_cannot_start_is_named_and_nothing_is_left(tmp_path):
    slurm = SlurmCluster(["node1"], tmp_path / "slurm")
    slurm._write_files = lambda: (slurm.logs.mkdir(parents=True), slurm.conf.write_text("Bogus=1\n"))  # no key either
    with pytest.raises(ClusterError, match="munged on node1 exited"):
        slurm.start()
    assert slurm.leftovers() == []


def test_the_script_runs_one_command_on_a_fresh_cluster_and_leaves_nothing(tmp_path):
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "scripts" / "slurm-local.sh"
    out = subprocess.run([script, "--nodes", "2", "--workdir", str(tmp_path / "w"), "--", "srun", "-N2", "hostname"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["node1", "node2"]
    assert not (tmp_path / "w" / "munge" / "munge.key").exists()
    failed = subprocess.run([script, "--nodes", "1", "--", "srun", "false"], capture_output=True, text=True, timeout=180)
    assert failed.returncode == 1, failed.stderr  # the command's own exit code
