"""slurm.conf and slurmdbd.conf of the local Slurm cluster: pure builders, exact lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from training_toolkit.local.slurm_accounting import slurmdbd_conf
from training_toolkit.local.slurm_conf import slurm_conf


def test_nodes_are_named_as_their_hosts_and_addressed_by_their_address():
    text = slurm_conf([("node1", "192.0.2.11"), ("node2", "192.0.2.12")], Path("/w"), cpus=4, kill_wait_s=7)
    lines = text.splitlines()
    assert "SlurmctldHost=node1(192.0.2.11)" in lines
    assert "NodeName=node2 NodeAddr=192.0.2.12 CPUs=4 State=UNKNOWN" in lines
    assert "PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" in lines
    assert {"KillWait=7", "SlurmdSpoolDir=/run/slurmd", "StateSaveLocation=/w/ctld", "TmpFS=/run",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none"} <= set(lines)
    assert not any("cgroup" in line for line in lines)
    assert "SlurmdTimeout=60" in lines


def test_a_head_host_runs_the_controller_and_is_no_node():
    lines = slurm_conf([("node1", "192.0.2.11"), ("node2", "192.0.2.12")], Path("/w"), accounting=True,
                       controller=("head", "192.0.2.10")).splitlines()
    assert {"SlurmctldHost=head(192.0.2.10)", "AccountingStorageHost=head"} <= set(lines)
    assert [line for line in lines if line.startswith("NodeName=")] == [
        "NodeName=node1 NodeAddr=192.0.2.11 CPUs=4 State=UNKNOWN", "NodeName=node2 NodeAddr=192.0.2.12 CPUs=4 State=UNKNOWN"]
    assert "PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" in lines


def test_how_long_a_silent_node_stays_up_is_the_clusters_to_choose():
    lines = slurm_conf([("n1", "192.0.2.11")], Path("/w"), slurmd_timeout_s=10).splitlines()
    assert "SlurmdTimeout=10" in lines and "SlurmdTimeout=60" not in lines


def test_accounting_and_the_completion_log():
    lines = slurm_conf([("n1", "192.0.2.11")], Path("/w"), jobcomp=Path("/w/jobcomp.txt"), accounting=True).splitlines()
    assert {"AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=n1",
            "JobCompType=jobcomp/filetxt", "JobCompLoc=/w/jobcomp.txt"} <= set(lines)
    dbd = slurmdbd_conf("n1", "192.0.2.11", Path("/w/log/slurmdbd.log")).splitlines()
    assert {"DbdHost=n1", "DbdAddr=192.0.2.11", "StorageType=accounting_storage/mysql", "StorageHost=localhost",
            "StorageUser=root", "LogFile=/w/log/slurmdbd.log"} <= set(dbd)
    assert not any(line.startswith("StoragePass") for line in dbd)


def test_no_nodes_is_refused():
    with pytest.raises(ValueError, match="at least one node"):
        slurm_conf([], Path("/w"))
