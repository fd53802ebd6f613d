"""slurm.conf for a Slurm cluster made of local namespace hosts; pure, nothing is created.

A namespace host has its own hostname, address, ``/run`` and PID namespace but shares the
machine's file system and cgroups, so the configuration keeps to what works there: processes
tracked through ``/proc`` (``proctrack/linuxproc``), no task binding (``task/none``), no cgroup
plugin at all; every file the daemons write sits under the cluster's own directory, so two clusters on
one machine never share one, except a node's spool directory, which is in the node's own ``/run``:
slurmd makes a Unix socket per step there, and a socket's path may not be over 108 bytes (a
workdir of a test run by pytest-xdist made one 109 bytes long, and every step failed).  Each node is
named as its host (``NodeName`` = the namespace's hostname) and addressed by its address, as a
real cluster's nodes are.  ``SlurmdParameters=config_overrides`` keeps a node usable when it
says it has more CPUs than the machine: a test asks for two ranks per node on a 2-core machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

CLUSTER_NAME = "toolkit"
PARTITION = "debug"
CTLD_PORT = 6817
SLURMD_PORT = 6818


def slurm_conf(
    nodes: Sequence[tuple[str, str]],
    state_dir: Path,
    *,
    cpus: int = 4,
    kill_wait_s: int = 30,
    slurmd_timeout_s: int = 60,
    jobcomp: Path | None = None,
    accounting: bool = False,
    controller: tuple[str, str] | None = None,
) -> str:
    """The text of slurm.conf: ``nodes`` is ``(name, address)`` in order; ``controller`` (the same) runs slurmctld,
    a head host that is no node, as a real cluster's head node is (None: the first node runs it)."""
    if not nodes:
        raise ValueError("a Slurm cluster needs at least one node")
    controller, controller_address = controller or nodes[0]
    lines = [
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={controller}({controller_address})",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={state_dir / 'ctld'}",
        "SlurmdSpoolDir=/run/slurmd",  # each host's own /run, a short path: the steps' sockets are made there
        "SlurmctldPidFile=/run/slurmctld.pid",  # /run is each host's own
        "TmpFS=/run",  # srun --mpi=pmix makes its per-step directories there: /tmp is the machine's, shared
        "SlurmdPidFile=/run/slurmd.pid",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
        *(["AccountingStorageType=accounting_storage/slurmdbd", f"AccountingStorageHost={controller}"] if accounting
          else ["AccountingStorageType=accounting_storage/none"]),
        f"JobCompType={'jobcomp/filetxt' if jobcomp else 'jobcomp/none'}",
        *([f"JobCompLoc={jobcomp}"] if jobcomp else []),
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "PropagateResourceLimits=NONE",
        f"KillWait={kill_wait_s}",
        "MinJobAge=300",
        "SlurmctldTimeout=30",
        f"SlurmdTimeout={slurmd_timeout_s}",  # how long a silent node stays up: a dead one is DOWN after it
        "InactiveLimit=0",
        "MessageTimeout=20",
        "SchedulerType=sched/builtin",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, address in nodes:
        lines.append(f"NodeName={name} NodeAddr={address} CPUs={cpus} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(n for n, _ in nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"
