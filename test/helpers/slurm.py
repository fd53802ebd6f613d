"""A real Slurm cluster on local namespace hosts for a test, closed and checked for leftovers afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training_toolkit.local.slurm import SlurmCluster

#: Tags of this run's clusters start with it, so no check mistakes another run's cluster for ours.
RUN_PREFIX = f"tts{os.getpid() % 100000}"


@contextmanager
def slurm_cluster(tmp_path: Path, nodes: int = 2, **kw) -> Iterator[SlurmCluster]:
    """Nodes ``node1..nodeN``; on the way out: nothing of the cluster left (no process, namespace, key)."""
    names = [f"node{i}" for i in range(1, nodes + 1)]
    slurm = SlurmCluster(names, tmp_path / "slurm", tag=f"{RUN_PREFIX}-{os.urandom(2).hex()}", **kw)
    with slurm:
        yield slurm
    left = slurm.leftovers()
    assert not left, f"left behind by the Slurm cluster: {left}"
