"""MPI: passwordless SSH between the hosts, ``mpirun`` from the first host (Horovod, mpi4py).

Every host joins the channel, fetches the code, writes the job's ssh directory
and starts its own sshd; the first host waits until all are ready, checks it
can log in to each, and runs mpirun.  mpirun's end is the job's end: its
verdict goes to every host at once.  Every host writes its own ranks' command and
environment to a file first (``rank_env``): each rank sees its own host's contract,
and mpirun carries nothing of the job across the network.

Under Slurm (``TRAINING_TOOLKIT_MPI_LAUNCHER=slurm``, the Slurm platform's default) there is no
ssh at all: no keys, no sshd; mpirun starts its daemons with ``srun --overlap`` inside the job's
step (Open MPI's plm slurm), so a worker's ranks run under Slurm's step daemon, not under its
``train``, which finds them by their mark in the environment (docs/slurm.md).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from training_toolkit import names, native, procfs, rundir, settings, stacks
from training_toolkit.cluster import netaddr, ssh
from training_toolkit.cluster.guard import RUNTIME, GuardSpec
from training_toolkit.errors import ClusterError
from training_toolkit.log import log
from training_toolkit.names import LAUNCH_SLURM, OPENMPI4, OPENMPI5
from training_toolkit.plan import MpiOptions
from training_toolkit.process import ExitStatus
from training_toolkit.redact import redact
from training_toolkit.report import Outcome
from training_toolkit.settings import RANK_STOP_FLAG_VAR, STOP_FLAG_VAR, without_secrets
from training_toolkit.runners import rank_env
from training_toolkit.runners.netshim import PRELOAD, Shim
from training_toolkit.runners.mpi_failure import LOST_DAEMON_EXIT, describe_mpi_failure, lost_a_daemon
from training_toolkit.runners.mpi_command import BLOCK_SIGTERM, MpiJob, mpirun_command
from training_toolkit.runspec import Local, Proc, RunContext, RunnerSpec, Seating
from training_toolkit.stopping import stop_processes
from training_toolkit.supervise.deadman import Deadman


def spec(ctx: RunContext) -> RunnerSpec:
    """This host's part (``MpiHost``'s hooks); guarded: every listener of Open MPI's runtime, the ranks' BTL port range."""
    host = MpiHost(ctx)
    # through Slurm, a worker's daemon and ranks are not below its train: found by the stop flag's variable,
    # which mpirun's environment gives every daemon of this job (and so every rank)
    roots = host.daemons if host.via_slurm else None
    return RunnerSpec(host.start, guard=GuardSpec(ports=BTL_PORTS, every_port_of=RUNTIME, roots=roots),
                      introduction=host.introduction, hold=host.held, prepare=host.prepare,
                      after_barrier=host.after_barrier, before_restart=host.prepare_attempt,
                      after_restart_barrier=host.after_restart_barrier, judge=judged, failure=host.failure_of,
                      stop=host.stop, stop_for_restart=host.stop_part, watched=host.watched,
                      follows_active_hosts=False)  # mpirun's hosts and the rank files are the job's (issue 25)


RANK_TAG_VAR = settings.RANK_TAG_VAR  # in every rank's environment: how each host finds its own ranks
INTRO_CLIENT_KEY = "ssh_client_key"  # what the first host introduces: the public half of the job's client key
INTRO_HOST_KEY = "ssh_host_key"  # what every other host introduces: the public half of its own host key
STOP_FLAG_NAME = "stopping"  # beside the rank file: this host's train is stopping its ranks (native/stophold.c)


class MpiHost:
    """This host's part of an MPI job: what it holds, and its hooks (``spec``).

    Ranks run under mpirun and sshd, not as our children; signals reach them through ``rank_tag``.

    Keys: the first host makes the job's client key, every other host its own
    host key, each from the OS's random generator (or all read from mounted
    keys); the public halves travel in the channel's introductions.  A worker
    writes its sshd files once it knows the client key (after joining); the
    first host pins the workers' host keys once every host has joined (after
    the barrier).

    A stopping signal on any host goes straight to that host's ranks (with the
    grace period, so they can checkpoint), not through mpirun, whose own
    SIGTERM handling would kill every rank after a second.  A rank's death, on
    the other hand, makes mpirun end the job at once (no kill timeout), except
    during a stop: then the runtime's kills are held (``_hold_kills``,
    native/stophold.c), so that the first rank to end its handler does not end
    the others'.
    """

    def __init__(self, ctx: RunContext):
        self.ctx = ctx  # the job's hosts the first host's from ``prepare`` on (``Seating.ctx``)
        self.host = ctx.plan.current_host
        self.is_master = ctx.plan.hosts[0] == self.host
        self.layout: ssh.SshLayout | None = None
        self.sshd: ssh.Sshd | None = None
        self.rank_tag = ""  # the job's id, from the first host: the same on every host
        self.ssh_port = ctx.settings.ssh_port
        self._keys: ssh.KeyPair | None = None  # the client key on the first host, this host's host key elsewhere
        self._ssh_dir: Path | None = None  # removed with everything in it when the job ends
        self._pinned: dict[str, str] = {}  # the first host: each worker's ssh host key, as pinned
        self._shim: Shim | None = None  # the accept() shim, with the job's addresses resolved once (prepare)
        self._tripwire: Deadman | None = None  # removes it, and ends sshd and its sessions, should train be killed
        self._rank_file: Path | None = None  # this host's ranks' command and environment; removed at the end
        self._rank_tripwire: Deadman | None = None  # removes it, and ends this host's ranks, should train be killed
        self.via_slurm = ctx.settings.mpi_launcher == LAUNCH_SLURM  # daemons through srun: no ssh, no keys

    def _new_ssh_dir(self) -> Path:
        self._ssh_dir = ssh.new_ssh_dir()
        self._tripwire = Deadman(directories=[self._ssh_dir])  # sshd and ssh's shared connections: watch_for, environment_for
        return self._ssh_dir

    def introduction(self) -> dict[str, str]:
        if self.via_slurm:
            return {}
        keys_dir = self.ctx.settings.ssh_keys
        mounted = ssh.load_keys(keys_dir) if keys_dir else None
        if self.is_master:
            self._keys = mounted.client if mounted else ssh.generate_keypair(f"training-toolkit-client@{self.host}")
            return {INTRO_CLIENT_KEY: self._keys.public}
        self._keys = mounted.host if mounted else ssh.generate_keypair(f"training-toolkit-host@{self.host}")
        return {INTRO_HOST_KEY: self._keys.public}

    @contextmanager
    def held(self, seat: Seating):
        """What this host makes for the job (ssh directory, sshd, rank file, their tripwires): gone when it ends."""
        try:
            yield self
        finally:
            self.cleanup()

    def prepare(self, seat: Seating) -> None:
        assert self._keys is not None or self.via_slurm
        self.ctx = seat.ctx
        self.rank_tag = seat.job_id
        # sshd's from= and the shim's list are one list, resolved once: the rank file (rewritten at each
        # restart), sshd's sessions and mpirun all take this shim
        addresses = None if self.is_master else tuple(job_addresses(self.ctx.plan.hosts))
        self._shim = netshim(self.ctx, addresses)
        self._write_rank_file(seat)
        if self.is_master or self.via_slurm:
            return
        assert addresses is not None
        master = self.ctx.plan.hosts[0]
        client_public = _introduced(seat.introductions, master, INTRO_CLIENT_KEY)
        shim = self._shim
        # the daemons mpirun starts through this sshd: this host's ranks' file, the shim and the stop hold, set by
        # this host (sshd's sessions get nothing else)
        assert self._rank_file is not None
        session_env = {rank_env.RANK_FILE_VAR: str(self._rank_file),
                       PRELOAD: ":".join([shim.library, stophold_library()] if shim else [stophold_library()]),
                       **(shim.environment() if shim else {}), STOP_FLAG_VAR: str(self._stop_flag())}
        self.layout = ssh.write_server_side(
            self._new_ssh_dir(), host_key=self._keys, client_public=client_public, port=self.ssh_port,
            allowed_from=addresses, user=_user(),
            listen_addresses=listen_addresses(self.ctx.job.resource.network_interface_name, self.host),
            session_env=session_env)
        self.sshd = ssh.Sshd(self.layout, sshd_path=self.ctx.settings.sshd)
        self.sshd.start()

    def after_barrier(self, seat: Seating) -> None:
        if self.via_slurm:
            return
        assert self._keys is not None
        workers = self.ctx.plan.hosts[1:]
        self._pinned = self._host_keys(seat)
        self.layout = ssh.write_client_side(self._new_ssh_dir(), client_key=self._keys, host_keys=self._pinned,
                                            port=self.ssh_port)
        ssh.wait_for_ssh(self.layout, workers, deadline_s=min(60.0, seat.join_timeout_s))

    def after_restart_barrier(self, seat: Seating) -> None:
        """A host whose ``train`` restarted in its pod rejoined with a new sshd and host key: pin the keys anew."""
        if self.via_slurm:
            return
        assert self.layout is not None and self._keys is not None
        host_keys = self._host_keys(seat)
        if host_keys == self._pinned:
            return
        changed = sorted(host for host in host_keys if host_keys[host] != self._pinned.get(host))
        log(f"{self.host}: new ssh host key(s) of {', '.join(changed)}, which joined again: pinned")
        ssh.end_connections(self.layout)  # shared connections to an sshd that is gone
        self._pinned = host_keys
        ssh.repin_host_keys(self.layout, host_keys, port=self.ssh_port)
        ssh.wait_for_ssh(self.layout, changed, deadline_s=min(60.0, seat.join_timeout_s))

    def _host_keys(self, seat: Seating) -> dict[str, str]:
        introductions = seat.introductions or {}
        return {host: _introduced(introductions, host, INTRO_HOST_KEY) for host in self.ctx.plan.hosts[1:]}

    def _write_rank_file(self, seat: Seating) -> None:
        """This host's ranks' command and environment, written before any rank can start, at a path of its own."""
        # through Slurm every daemon gets mpirun's one environment: each host's directory is named after its node,
        # and the daemons find theirs from a path they complete with their own node's name (slurm_paths)
        path = self._rank_file = (rank_env.node_rank_file_path(self.rank_tag, self.host) if self.via_slurm
                                  else rank_env.new_rank_file_path(self.rank_tag))
        self._rank_tripwire = Deadman([f"{RANK_TAG_VAR}={self.rank_tag}"], [path.parent])
        rank_env.write_rank_file(path, self._rank_file_data(seat))

    def _rank_file_data(self, seat: Seating) -> bytes:
        # the attempt and the stall watch's variables (the agent's job_env) are this host's too
        env = rank_environment(self.ctx, self.rank_tag, seat.job_env(self.ctx.script_env), self._shim,
                               stop_flag=str(self._stop_flag()))
        return rank_env.encode_rank_file(str(self.ctx.code_dir), user_command(self.ctx, has_mpi4py(self.ctx.python)),
                                         env)

    def prepare_attempt(self, seat: Seating) -> None:
        """Before a restart's barrier, so no rank of the new attempt can start from the old file."""
        if self._rank_file is not None:
            self._stop_flag().unlink(missing_ok=True)  # (a stop that came during a restart) the new attempt's runtime ends its job on a failure
            rank_env.rewrite_rank_file(self._rank_file, self._rank_file_data(seat))

    def _stop_flag(self) -> Path:
        """While this file exists, Open MPI's runtime on this host sees no rank end and kills none (native/stophold.c)."""
        assert self._rank_file is not None
        return self._rank_file.parent / STOP_FLAG_NAME

    def _hold_kills(self) -> None:
        """From now on the stop is this host's train's: a rank that ends first no longer makes the runtime end the rest.

        Open MPI aborts the job when a rank exits non-zero (Open MPI 4's orte_abort_on_non_zero_status,
        PRRTE's default), dies of a signal, exits without MPI_Finalize or calls MPI_Abort (``python -m
        mpi4py`` after a non-zero SystemExit): its daemons kill every rank and exit, and a rank that
        initialised MPI ends when its daemon does.  Each host, before its ranks get the signal, keeps its
        own runtime from seeing a rank's end and from killing one, and its ranks' MPI_Abort from reaching
        it (native/stophold.c); the grace period and the SIGKILL after it are train's.
        """
        if self._rank_file is not None:
            self._stop_flag().touch(mode=0o600, exist_ok=True)

    def start(self, seat: Seating) -> list[Proc]:
        if not self.is_master:
            return []
        assert (self.layout is not None or self.via_slurm) and self._rank_file is not None
        flavor = mpi_flavor(self.ctx.settings.mpi_flavor, self.ctx.environ)
        command = build_command(self.ctx, self.layout, flavor)
        if flavor == OPENMPI4:
            command = [*BLOCK_SIGTERM, *command]  # what the plan shows, started with SIGTERM blocked
        preload, extra = mpirun_preload(self.ctx, self._shim)
        preload.append(stophold_library())  # mpirun is the first host's daemon: it kills its own ranks
        extra[STOP_FLAG_VAR] = str(self._stop_flag())
        extra[rank_env.RANK_FILE_VAR] = str(self._rank_file)  # for the ranks it starts on this host
        if self.via_slurm:
            extra.update(slurm_environment(self.ctx))
            extra.update(slurm_paths(self._rank_file, self._stop_flag(), self.host))
            if not self.ctx.environ.get("HOME"):  # a batch script may have none; Open MPI 5's opal_init fails without
                extra["HOME"] = _home()
        env = rank_env.mpirun_environment(self.ctx.environ, preload, extra)
        return [Proc("mpirun", tuple(command), env, str(self.ctx.code_dir), program=False)]

    def watched(self, locals_: Sequence[Local]) -> list[stacks.Watched]:
        """This host's ranks (under mpirun here, under sshd elsewhere), each with its job-wide rank."""
        found = []
        for pid in self._ranks(locals_):
            rank = stacks.rank_of(pid)
            found.append(stacks.Watched(pid, rank, f"rank {rank}" if rank is not None else f"process {pid}"))
        return found

    def stop_part(self, locals_: Sequence[Local]) -> None:
        """For a restart: this host's ranks get the stopping signal and the grace period; the agent then ends mpirun.

        No hold here (``_hold_kills``): mpirun must see its ranks end to end by itself, and a restart's
        stop has no verdict after which train would end it.
        """
        stop_processes(lambda: self._ranks(locals_), self.ctx.grace_s, signal.SIGTERM)

    def stop(self, signum: int, locals_: Sequence[Local]) -> None:
        """A stopping signal: this host's ranks get it (not through mpirun), the grace period, then SIGKILL.

        Other signals the agent passes to mpirun, which passes SIGUSR1/2 to every rank.
        """
        self._hold_kills()
        stop_processes(lambda: self._ranks(locals_), self.ctx.grace_s, signum)

    def _ranks(self, locals_: Sequence[Local]) -> list[int]:
        mpirun = frozenset(local.child.pid for local in locals_)
        marker = f"{RANK_TAG_VAR}={self.rank_tag}".encode()
        if self.via_slurm and not self.is_master:  # under Slurm's step daemon, in this host's PID namespace
            return procfs.marked(marker, mpirun)
        return procfs.marked_descendants(os.getpid(), marker, mpirun)

    def daemons(self) -> list[int]:
        """Through Slurm: this host's Open MPI daemon (what mpirun's environment marks), for the listener guard."""
        if self._rank_file is None:
            return []
        flag = slurm_paths(self._rank_file, self._stop_flag(), self.host)[STOP_FLAG_VAR]
        return procfs.marked(f"{STOP_FLAG_VAR}={flag}".encode()) if not self.is_master else []

    def failure_of(self, local: Local, status: ExitStatus) -> Outcome:
        local.child.drain()
        tail = tuple(local.child.tail.lines(100))
        options = mpi_options(self.ctx)
        reason = describe_mpi_failure(tail, self.ctx.plan.hosts, options.processes_per_host, status)
        return Outcome(status.exit_code, reason, tuple(local.child.argv), tail)

    def cleanup(self) -> None:
        if self.layout is not None and self.is_master:
            ssh.end_connections(self.layout)
        if self.sshd is not None:
            self.sshd.stop()
        if self._ssh_dir is not None:
            shutil.rmtree(self._ssh_dir, ignore_errors=True)
        if self._tripwire is not None:
            self._tripwire.disarm()
        if self._rank_file is not None:
            shutil.rmtree(self._rank_file.parent, ignore_errors=True)
        if self._rank_tripwire is not None:
            self._rank_tripwire.disarm()


def judged(local: Local, status: ExitStatus) -> ExitStatus:
    """mpirun's exit 0 after losing a daemon is a failure (``mpi_failure``)."""
    if status.ok:
        local.child.drain()
        if lost_a_daemon(tuple(local.child.tail.lines(100))):
            return ExitStatus(LOST_DAEMON_EXIT)
    return status


def mpi_options(ctx: RunContext) -> MpiOptions:
    options = ctx.plan.options
    assert isinstance(options, MpiOptions), options
    return options


def describe(ctx: RunContext) -> dict:
    """The mpirun line the first host would run (for ``training-toolkit plan``); writes nothing, runs nothing.

    Without the flavour setting, ``mpirun --version`` decides at run time: the line shown is Open MPI 4's.
    """
    parent = rundir.parent()
    via_slurm = ctx.settings.mpi_launcher == LAUNCH_SLURM
    layout = None if via_slurm else ssh.SshLayout(parent / f"{ssh.layout.DIR_PREFIX}RANDOM", ctx.settings.ssh_port)
    rank_file = parent / f"{rank_env.DIR_PREFIX}JOBID-RANDOM" / rank_env.FILE_NAME
    flavor = ctx.settings.mpi_flavor
    shown = flavor or f"detected at run time (mpirun --version); the mpirun line shown is {OPENMPI4}'s"
    ranks = rank_environment(ctx, "JOBID", shim=netshim(ctx, addresses=("ADDRESSES",), shown_only=True))
    return {"mpi_flavor": shown, "mpi_launcher": ctx.settings.mpi_launcher,
            "mpirun": build_command(ctx, layout, flavor or OPENMPI4),
            **({"mpirun_slurm_environment": slurm_environment(ctx)} if via_slurm else {}),
            "rank_file": f"{rank_env.RANK_FILE_VAR}={rank_file} (each host's own)",
            "rank_command": user_command(ctx, has_mpi4py(ctx.python, ask=False)),
            "rank_environment_added": redact({k: v for k, v in ranks.items() if ctx.script_env.get(k) != v})}


def _introduced(introductions, host: str, key: str) -> str:
    """A public key another host introduced, checked; a ClusterError naming the host if it did not."""
    line = introductions.get(host, {}).get(key)
    if not line:
        raise ClusterError(f"{host} did not introduce its {key.replace('_', ' ')} (a host of another toolkit version?)")
    return ssh.keys.check_public_line(line, f"{key.replace('_', ' ')} of {host}")


job_addresses = netaddr.job_addresses


def listen_addresses(interface: str, host: str) -> list[str]:
    """Where this host's sshd listens: its address on the job's interface, else what its name resolves to."""
    address = netaddr.interface_ipv4(interface)
    if address:
        return [address]
    return sorted(a for a in netaddr.resolve(host) if not netaddr.is_loopback(a))


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def mpi_flavor(configured: str | None, environ) -> str:
    """The setting's flavour, else what ``mpirun --version`` says (at run time only, never in ``plan``)."""
    if configured:
        return configured
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20,
                             env=without_secrets(environ))
    except FileNotFoundError:
        raise ClusterError("mpirun not found on PATH (install Open MPI)") from None
    except subprocess.TimeoutExpired:
        raise ClusterError("mpirun --version did not answer within 20 s") from None
    match = re.search(r"Open MPI\)?\s+(\d+)\.", out.stdout + out.stderr)
    return OPENMPI5 if match and int(match.group(1)) >= 5 else OPENMPI4


def has_mpi4py(python: str, ask: bool = True) -> bool:
    """Whether ``python`` has mpi4py: ours looks, another is asked (``ask=False``, as in plan: assumed)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return importlib.util.find_spec("mpi4py") is not None
    if not ask:
        return True
    try:
        return subprocess.run([python, "-c", "import mpi4py"], capture_output=True, timeout=30,
                              env=without_secrets(os.environ)).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def smddp_env(ctx: RunContext) -> dict[str, str]:
    """What SageMaker's data parallel library's launcher sets for its ranks (reference: smdataparallel)."""
    if not mpi_options(ctx).smddp:
        return {}
    return {"SMDATAPARALLEL_USE_HOMOGENEOUS": "0" if ctx.job.is_hetero else "1", "MASTER_ADDR": ctx.plan.master,
            "MASTER_PORT": ctx.environ.get("MASTER_PORT", str(names.TORCH_MASTER_PORT))}


def rank_environment(ctx: RunContext, rank_tag: str, script_env: Mapping[str, str] | None = None,
                     shim: Shim | None = None, stop_flag: str | None = None) -> dict[str, str]:
    """This host's ranks' environment: its contract, NCCL's defaults, the custom options' variables, the preloads.

    The accept() shim checks a rank's BTL listeners only (as the guard does): a script's own servers are its own.
    ``stop_flag``: during a stop (the file exists) a rank's MPI_Abort ends that rank alone (native/stophold.c).
    """
    hostname = hostname_preload(ctx.plan.current_host)
    preload = [hostname] if hostname else []
    extra = {**smddp_env(ctx), RANK_TAG_VAR: rank_tag}
    if shim is not None:
        preload.append(shim.library)
        extra.update(shim.environment(BTL_PORTS))
    if stop_flag is not None:
        preload.append(stophold_library())
        extra[RANK_STOP_FLAG_VAR] = stop_flag
    return rank_env.rank_environment(ctx.script_env if script_env is None else script_env,
                                     interface=ctx.job.resource.network_interface_name,
                                     custom=mpi_options(ctx).custom, preload=preload, extra=extra)


BTL_PORTS = range(names.MPI_BTL_PORT_MIN, names.MPI_BTL_PORT_MIN + names.MPI_BTL_PORT_RANGE)


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


def stophold_library() -> str:
    """The library that holds Open MPI's reaction to a rank's end while a host stops its ranks (native/stophold.c)."""
    return str(native.path_of(native.STOPHOLD_LIBRARY))


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


def slurm_environment(ctx: RunContext) -> dict[str, str]:
    """What mpirun needs of Slurm to start its daemons with srun, and nothing of train's own task.

    Open MPI's Slurm launcher is chosen when ``SLURM_JOBID`` is set; its allocation reader then takes
    the hosts from ``SLURM_NODELIST`` and their slots from ``SLURM_TASKS_PER_NODE`` (``N(xM)``): the
    job's hosts and ranks per host, not the step's one task per node.  srun itself needs the job's id
    (``SLURM_JOB_ID``) and, where the cluster has one, ``SLURM_CONF``; every other ``SLURM_*`` of train's
    task is left out (the platform unsets them), so srun's own input variables (``SLURM_NTASKS``,
    ``SLURM_DISTRIBUTION``...) cannot reshape the daemons' step.
    """
    job = ctx.environ.get("SLURM_JOB_ID") or ctx.environ.get("SLURM_JOBID")
    if not job:
        raise ClusterError(f"TRAINING_TOOLKIT_MPI_LAUNCHER={LAUNCH_SLURM} outside a Slurm job: SLURM_JOB_ID is not set")
    hosts = ctx.plan.hosts
    env = {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_NODELIST": ",".join(hosts),
           "SLURM_TASKS_PER_NODE": f"{mpi_options(ctx).processes_per_host}(x{len(hosts)})"}
    if ctx.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = ctx.environ["SLURM_CONF"]
    return env


SLURMD_NODE_VAR = "SLURMD_NODENAME"  # what slurmstepd sets for every task: the node's name
NODE_PLACEHOLDER = "%n"  # in the daemons' paths: native/rank_exec.c and stophold.c put the node's name there


def slurm_paths(rank_file: Path, stop_flag: Path, host: str) -> dict[str, str]:
    """The rank file's and the stop flag's paths for every daemon through Slurm: this host's name in them is
    ``%n``, which each daemon and rank completes with its node's ``SLURMD_NODENAME`` (slurmstepd sets it for
    the daemons; mpirun, this host's daemon, gets this host's).  Every host names its directory alike
    (``rank_env.node_rank_file_path``) under the same parent (docs/slurm.md)."""
    def template(path: Path) -> str:
        text = str(path)
        assert text.count(host) >= 1, (text, host)
        head, _, tail = text.rpartition(host)
        return f"{head}{NODE_PLACEHOLDER}{tail}"
    return {rank_env.RANK_FILE_VAR: template(rank_file), STOP_FLAG_VAR: template(stop_flag), SLURMD_NODE_VAR: host}


def _home() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_dir or "/"
    except KeyError:
        return "/"


def build_command(ctx: RunContext, layout: ssh.SshLayout | None, flavor: str) -> list[str]:
    """mpirun's line: every rank runs ``training-toolkit-rank``, which reads the file its host names; nothing of the job."""
    options = mpi_options(ctx)
    job = MpiJob(
        hosts=ctx.plan.hosts,
        processes_per_host=options.processes_per_host,
        num_processes=options.num_processes,
        interface=ctx.job.resource.network_interface_name,
        rank_command=(str(native.path_of(native.RANK_PROGRAM)),),
        rsh_agent=tuple(ssh.ssh_command(layout)) if layout is not None else (),
        custom_options=options.custom.mpirun_args,
        as_root=os.geteuid() == 0,
        via_slurm=layout is None,
    )
    return mpirun_command(job, flavor)
