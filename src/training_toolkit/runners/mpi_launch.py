"""What the lead runs and every rank sees in an MPI job: mpirun's line, its environment, the ranks' environment.

Builders of values from the ``RunContext`` (the attempt's: its active hosts only, ``Seating.ctx`` for
``processes``), used by ``runners/mpi.py`` at run time and by ``describe`` (``training-toolkit plan``).
``has_mpi4py`` and ``mpi_flavor`` ask a program (given the environment to ask it in); nothing else runs anything.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from training_toolkit import native

from training_toolkit.core import names

from training_toolkit.config import settings
from training_toolkit.cluster import netaddr
from training_toolkit.cluster.ssh.layout import SshLayout
from training_toolkit.core.errors import ClusterError
from training_toolkit.core.log import log
from training_toolkit.core.names import LAUNCH_SLURM, OPENMPI4, OPENMPI5
from training_toolkit.job.plan import MpiOptions
from training_toolkit.runners import rank_env
from training_toolkit.runners.mpi_command import MpiJob, mpirun_command
from training_toolkit.runners.netshim import Shim
from training_toolkit.runners.one_stop import rank_stop_library, stop_window
from training_toolkit.runspec import RunContext, introduced_count, with_job
from training_toolkit.config.settings import without_secrets

RANK_TAG_VAR = settings.RANK_TAG_VAR  # in every rank's environment: how each host finds its own ranks
BTL_PORTS = range(names.MPI_BTL_PORT_MIN, names.MPI_BTL_PORT_MIN + names.MPI_BTL_PORT_RANGE)
SLURMD_NODE_VAR = "SLURMD_NODENAME"  # what slurmstepd sets for every task: the node's name
NODE_PLACEHOLDER = "%n"  # in the daemons' rank file path: native/rank_exec.c puts the node's name there
job_addresses = netaddr.job_addresses


def mpi_options(ctx: RunContext) -> MpiOptions:
    options = ctx.plan.options
    assert isinstance(options, MpiOptions), options
    return options

PER_HOST_INTRO = "mpi_processes_per_host"  # in each host's introduction: its own count of ranks per host


def job_per_host(named: bool, leads: bool, said: str) -> int | None:
    """The ranks per host this host takes from the job (None: its own): the count the lead ``said`` in its
    introduction, if this host's hyperparameters ``named`` none and it does not lead.
    Every host's mpirun then runs the job's count, whichever host leads: an MPIJob's launcher alone has the slots
    (its hostfile), and a worker that leads after its loss runs mpirun with them (docs/kubernetes.md)."""
    return None if named or leads else introduced_count(said)


def with_job_per_host(ctx: RunContext, per_host: int | None) -> RunContext:
    """``ctx`` as the job runs it with ``per_host`` ranks per host (``job_per_host``; None: ``ctx`` itself): mpirun's
    count, and what every rank of this host reads (the count among the framework parameters in
    ``SM_FRAMEWORK_PARAMS`` and ``SM_TRAINING_ENV``, as the lead's own ranks read it).  Pure."""
    if per_host is None:
        return ctx
    from training_toolkit.job import spec as job
    from training_toolkit.job.plan import with_processes_per_host

    return with_job(ctx, job.with_framework_params(ctx.job, {names.MPI_PROCESSES_PER_HOST: per_host}),
                    with_processes_per_host(ctx.plan, per_host, str(ctx.job.paths.hyperparameters_file)))


def mpi_flavor(configured: str | None, environ) -> str:
    """The setting's flavour, else what ``mpirun --version`` says (at run time only, never in ``plan``)."""
    if configured:
        return configured
    env = {**without_secrets(environ), **missing_home(environ)}  # without one, Open MPI 5's says no version at all
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20, env=env)
    except FileNotFoundError:
        raise ClusterError("mpirun not found on PATH (install Open MPI)") from None
    except subprocess.TimeoutExpired:
        raise ClusterError("mpirun --version did not answer within 20 s") from None
    match = re.search(r"Open MPI\)?\s+(\d+)\.", out.stdout + out.stderr)
    return OPENMPI5 if match and int(match.group(1)) >= 5 else OPENMPI4


def has_mpi4py(python: str, environ: Mapping[str, str], ask: bool = True) -> bool:
    """Whether ``python`` has mpi4py: ours looks, another is asked in ``environ`` (``ask=False``, as in plan: assumed)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return importlib.util.find_spec("mpi4py") is not None
    if not ask:
        return True
    try:
        return subprocess.run([python, "-c", "import mpi4py"], capture_output=True, timeout=30,
                              env=without_secrets(environ)).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def smddp_env(ctx: RunContext) -> dict[str, str]:
    """What SageMaker's data parallel library's launcher sets for its ranks (reference: smdataparallel)."""
    if not mpi_options(ctx).smddp:
        return {}
    return {"SMDATAPARALLEL_USE_HOMOGENEOUS": "0" if ctx.job.is_hetero else "1", "MASTER_ADDR": ctx.plan.lead,
            "MASTER_PORT": ctx.environ.get("MASTER_PORT", str(names.TORCH_MASTER_PORT))}


def rank_environment(ctx: RunContext, rank_tag: str, script_env: Mapping[str, str] | None = None,
                     shim: Shim | None = None, attempt: int | None = None) -> dict[str, str]:
    """This host's ranks' environment: its contract, NCCL's defaults, the custom options' variables, the preloads.

    The accept() shim checks a rank's BTL listeners only (as the guard does): a script's own servers are its own.
    Every rank gets the rank's stop library (native/rank_stop.c): while its host's stop flag exists (its path is
    the agent's, in ``script_env``: supervise/reported.py), a rank's MPI_Abort ends that rank alone; SIGTERMs
    within ``STOP_HEARD_S`` are one stop, and a rank's end after one waits as long for its host's flags
    (native/rank_exec.c), where the platform signals the rank before its host does.
    ``attempt``: the attempt these ranks are of (``rank_env.ATTEMPT_VAR``), what mpirun's ``--attempt`` waits for;
    None: of no attempt (the file a host writes before any attempt's hosts are known).
    """
    hostname = hostname_preload(ctx.plan.current_host)
    preload = [hostname] if hostname else []
    extra = {**smddp_env(ctx), RANK_TAG_VAR: rank_tag}
    if attempt is not None:
        extra[rank_env.ATTEMPT_VAR] = str(attempt)
    if shim is not None:
        preload.append(shim.library)
        extra.update(shim.environment(BTL_PORTS))
    preload.append(rank_stop_library())
    extra.update(stop_window())
    return rank_env.rank_environment(ctx.script_env if script_env is None else script_env,
                                     interface=ctx.job.resource.network_interface_name,
                                     custom=mpi_options(ctx).custom, preload=preload, extra=extra)

def netshim(ctx: RunContext, addresses: tuple[str, ...] | None = None, shown_only: bool = False) -> Shim | None:
    """The accept() shim with the job's addresses (``job_addresses``, as sshd's ``from=``, unless given), unless off."""
    if not ctx.settings.netshim:
        return None
    shim = Shim(str(native.path_of(native.NETSHIM_LIBRARY)), addresses or tuple(job_addresses(ctx.plan.hosts)),
                shown_only)
    if shim.left_out:
        log(f"accept() shim: left out {', '.join(shim.left_out)}: not an address it parses here")
    return shim


def mpirun_preload(ctx: RunContext, shim: Shim | None) -> tuple[list[str], dict[str, str]]:
    """mpirun's preloads and their variables: gethostname() where the kernel's name is not the host's, the shim.

    mpirun's own ``gethostname()`` must say its host: Open MPI 5 (PRRTE) finds itself in ``--host``
    by its name, and where every kernel host name is ``aws`` it would ssh to its own host for its
    own ranks, where no sshd runs (Open MPI 4 recognised its host without it).
    """
    host = ctx.plan.current_host
    hostname = hostname_preload(host)
    preload, extra = ([hostname], {rank_env.HOST_VARIABLE: host}) if hostname else ([], {})
    if shim is not None:
        preload.append(shim.library)
        extra.update(shim.environment())  # every listener of mpirun and its local daemon's work
    return preload, extra


def hostname_preload(host: str) -> str | None:
    """The gethostname() library, where this host's kernel name is not already the job's name for it."""
    if not rank_env.needs_hostname_preload(os.uname().nodename, host):
        return None
    return str(native.path_of(native.HOSTNAME_LIBRARY))


def user_command(ctx: RunContext, with_mpi4py: bool) -> tuple[str, ...]:
    """What each rank runs after the rank program: the user's command, Python through mpi4py, as the reference.

    With the vendor's ``smddprun`` installed, the data parallel library's ranks go through it, as the reference does.
    """
    argv = list(ctx.argv)
    is_python = len(argv) >= 2 and argv[0] == ctx.python
    if is_python and with_mpi4py:
        argv = [argv[0], "-m", "mpi4py", *argv[1:]]
    smddprun = shutil.which("smddprun", path=ctx.script_env.get("PATH")) if mpi_options(ctx).smddp else None
    return (smddprun, *argv) if smddprun else tuple(argv)


def in_slurm_order(hosts: tuple[str, ...], slurm_order: tuple[str, ...]) -> tuple[str, ...]:
    """``hosts`` in Slurm's node order (``slurm_order``: the step's nodes as Slurm lists them), any host not in it
    last, in its own order.  A daemon srun starts takes its identity from its node's place in its step
    (``SLURM_NODEID``), and Slurm numbers a step's nodes in this order whatever order they were asked in."""
    place = {host: index for index, host in enumerate(slurm_order)}
    return tuple(sorted(hosts, key=lambda host: place.get(host, len(place))))


def slurm_environment(ctx: RunContext, slurm_order: tuple[str, ...] | None = None) -> dict[str, str]:
    """What mpirun needs of Slurm to start its daemons with srun, and nothing of train's own task.

    Open MPI's Slurm launcher is chosen when ``SLURM_JOBID`` is set; its allocation reader then takes
    the hosts from ``SLURM_NODELIST`` and their slots from ``SLURM_TASKS_PER_NODE`` (``N(xM)``): the
    job's hosts and ranks per host, not the step's one task per node.  srun itself needs the job's id
    (``SLURM_JOB_ID``) and, where the cluster has one, ``SLURM_CONF``; every other ``SLURM_*`` of train's
    task is left out (the platform unsets them), so srun's own input variables (``SLURM_NTASKS``,
    ``SLURM_DISTRIBUTION``...) cannot reshape the daemons' step.

    ``SLURM_NODELIST`` lists the attempt's hosts in Slurm's order (``slurm_order``: the job's hosts as the
    platform gave them, the step's nodes in Slurm's order; None: ``ctx``'s own), not the seating's: mpirun
    numbers its daemons in its allocation's order, and each daemon takes the number of its place in srun's
    step, which Slurm orders its own way; where the two differ a daemon runs another node's ranks.  The
    ranks follow the seating by name (``--map-by seq``, runners/mpi_command.py).
    """
    job = ctx.environ.get("SLURM_JOB_ID") or ctx.environ.get("SLURM_JOBID")
    if not job:
        raise ClusterError(f"TRAINING_TOOLKIT_MPI_LAUNCHER={LAUNCH_SLURM} outside a Slurm job: SLURM_JOB_ID is not set")
    hosts = in_slurm_order(ctx.plan.hosts, ctx.plan.hosts if slurm_order is None else slurm_order)
    env = {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_NODELIST": ",".join(hosts),
           "SLURM_TASKS_PER_NODE": f"{mpi_options(ctx).processes_per_host}(x{len(hosts)})"}
    if ctx.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = ctx.environ["SLURM_CONF"]
    return env

def slurm_paths(rank_file: Path, host: str) -> dict[str, str]:
    """The rank file's path for every daemon through Slurm: this host's name in it is ``%n``, which each daemon's
    ranks complete with their node's ``SLURMD_NODENAME`` (slurmstepd sets it for the daemons; mpirun, this host's
    daemon, gets this host's).  Every host names its directory alike (``rank_env.node_rank_file_path``) under the
    same parent (docs/slurm.md).  The same value marks this job's daemons on every node (``runners/mpi.py``)."""
    text = str(rank_file)
    assert text.count(host) >= 1, (text, host)
    head, _, tail = text.rpartition(host)
    return {rank_env.RANK_FILE_VAR: f"{head}{NODE_PLACEHOLDER}{tail}", SLURMD_NODE_VAR: host}


def missing_home(environ: Mapping[str, str]) -> dict[str, str]:
    """``HOME`` for mpirun where ``environ`` has none (a batch script may have none): Open MPI 5's opal_init fails
    without it."""
    return {} if environ.get("HOME") else {"HOME": home()}


def home() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_dir or "/"
    except KeyError:
        return "/"


def build_command(ctx: RunContext, layout: SshLayout | None, flavor: str, attempt: int) -> list[str]:
    """mpirun's line over ``ctx``'s hosts (an attempt's active hosts, in rank order): every rank runs
    ``training-toolkit-rank --attempt N``, which reads the file its host names once it is the attempt's; nothing
    of the job."""
    options = mpi_options(ctx)
    job = MpiJob(
        hosts=ctx.plan.hosts,
        processes_per_host=options.processes_per_host,
        num_processes=options.num_processes,
        interface=ctx.job.resource.network_interface_name,
        rank_command=(str(native.path_of(native.RANK_PROGRAM)), rank_env.ATTEMPT_FLAG, str(attempt)),
        rsh_agent=(str(native.path_of(native.SSH_AGENT_PROGRAM)),) if layout is not None else (),
        term_blocked=str(native.path_of(native.TERM_BLOCKED_PROGRAM)),
        custom_options=options.custom.mpirun_args,
        as_root=os.geteuid() == 0,
        via_slurm=layout is None,
    )
    return mpirun_command(job, flavor)
