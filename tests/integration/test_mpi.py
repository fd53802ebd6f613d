"""The MPI runner on real local clusters: sshd per host, mpirun, mpi4py, faults."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from multihost import hps, needs_mpi, needs_root_cluster, run, source_dir
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.mpi, needs_root_cluster(), needs_mpi()]

HOSTS3 = ("algo-1", "algo-2", "algo-3")
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30"}


def mpi_job(src: Path, hosts=HOSTS3, per_host=2, env=None, **extra) -> LocalJob:
    return LocalJob(hosts=hosts, hyperparameters=hps("mpi_allreduce.py", src, sagemaker_mpi_enabled=True,
                                                     sagemaker_mpi_num_of_processes_per_host=per_host, **extra),
                    env={**FAST, **(env or {})})


def test_mpi4py_allreduce_on_3_hosts_x_2(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    results = run(mpi_job(src, msg="a b; 'c' \"d\" $(id)"), tmp_path)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    assert all(r.success for r in results)
    ranks = {}
    for r in results:
        for f in r.model_dir.glob("rank-*.json"):
            info = json.loads(f.read_text())
            ranks[info["rank"]] = info
            assert info["sm_current_host"] == r.host == info["hostname"] == info["training_env_host"]
    assert sorted(ranks) == list(range(6))
    assert {info["sum"] for info in ranks.values()} == {21}
    assert all(info["argv"] == ["--msg", "a b; 'c' \"d\" $(id)"] for info in ranks.values())
    assert [ranks[i]["hostname"] for i in range(6)] == ["algo-1", "algo-1", "algo-2", "algo-2", "algo-3", "algo-3"]
    ended = [r.ended_at for r in results]
    assert max(ended) - min(ended) < 1.0, f"hosts ended {max(ended) - min(ended):.2f} s apart"


def test_a_rank_raising_fails_every_host_with_the_cause(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    results = run(mpi_job(src, env={"FAIL_RANK": "3"}), tmp_path)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    for r in results:
        assert not r.success
        first = r.failure.splitlines()[0]
        assert "rank 3" in first and "algo-2" in first, first
        assert "ValueError: rank 3 was told to fail" in first, first
