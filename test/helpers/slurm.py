"""A real Slurm cluster on local namespace hosts for a test, closed and checked for leftovers afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
def slurm_cluster(tmp_path: Path, nodes: int = 2, **kw) -> Iterator[SlurmCluster]:
    """Nodes ``node1..nodeN``; on the way out: nothing of the cluster left (no process, namespace, key)."""
    names = [f"node{i}" for i in range(1, nodes + 1)]
    slurm = SlurmCluster(names, tmp_path / "slurm", tag=f"{RUN_PREFIX}-{os.urandom(2).hex()}", **kw)
    with slurm:
        slurm.baseline = {pid for pids in slurm.cluster.pids().values() for pid in pids}  # the daemons, idle
        yield slurm
    left = slurm.leftovers()
    assert not left, f"left behind by the Slurm cluster: {left}"
