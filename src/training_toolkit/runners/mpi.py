"""MPI: passwordless SSH between the hosts, ``mpirun`` from the first host (Horovod, mpi4py).

Every host joins the channel, fetches the code, writes the job's ssh directory
and starts its own sshd; the first host waits until all are ready, checks it
can log in to each, and runs mpirun.  mpirun's end is the job's end: its
verdict goes to every host at once.  Ranks go through ``training_toolkit.rank``
so that each sees its own host's contract.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from training_toolkit import names, procfs, settings, stacks
from training_toolkit.agent import HostAgent, Local, PartStopped
from training_toolkit.cluster import netaddr, ssh
from training_toolkit.errors import ClusterError
from training_toolkit.names import OPENMPI4, OPENMPI5
from training_toolkit.plan import MpiOptions
from training_toolkit.process import STOPPING_SIGNALS, ExitStatus
from training_toolkit.report import Outcome, summary_line
from training_toolkit.runners.base import RunContext
from training_toolkit.settings import without_secrets
from training_toolkit.runners.mpi_command import MpiJob, forwardable, mpirun_command
from training_toolkit.stopping import stop_processes
from training_toolkit.tripwire import Tripwire

_TAGGED = re.compile(r"^\[\d+,(\d+)\]<(stderr|stdout)>:\s?(.*)$")
_ONLY_TAGS = re.compile(r"^(?:\s*\[\d+,\d+\]<(?:stderr|stdout)>:)*\s*$")  # Open MPI 5 flushes bare tags at the end
# mpirun's own reports.  Open MPI 5 (prterun) wraps them at about 76 columns, anywhere between
# words ("... exited on\nsignal 9 (Killed)."), and names a process [prterun-HOST-PID@1,RANK]
# where Open MPI 4 writes [[JOBID,1],RANK]: \s+ between words, both name forms.
_NOTICED = re.compile(r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+(\S+)\s+exited\s+on\s+signal\s+(\d+)")
_ABORT = re.compile(r"MPI_ABORT\s+was\s+invoked\s+on\s+rank\s+(\d+)")
_FIRST = re.compile(r"Process\s+name:\s*\[(?:\[\d+,\d+\]|[^\s\[\],]+@\d+),(\d+)\]")
_EXIT = re.compile(r"Exit\s+code:\s*(\d+)")


def run(ctx: RunContext) -> Outcome:
    return MpiAgent(ctx).run()


RANK_TAG_VAR = settings.RANK_TAG_VAR  # forwarded to every rank: how each host finds its own ranks
INTRO_CLIENT_KEY = "ssh_client_key"  # what the first host introduces: the public half of the job's client key
INTRO_HOST_KEY = "ssh_host_key"  # what every other host introduces: the public half of its own host key


class MpiAgent(HostAgent):
    """Ranks run under mpirun and sshd, not as our children; signals reach them through ``rank_tag``.

    Keys: the first host makes the job's client key, every other host its own
    host key, each from the OS's random generator (or all read from mounted
    keys); the public halves travel in the channel's introductions.  A worker
    writes its sshd files once it knows the client key (after joining); the
    first host pins the workers' host keys once every host has joined (after
    the barrier).

    A stopping signal on any host goes straight to that host's ranks (with the
    grace period, so they can checkpoint), not through mpirun, whose own
    SIGTERM handling would kill every rank after a second.  A rank's death, on
    the other hand, makes mpirun end the job at once (no kill timeout).
    """

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.layout: ssh.SshLayout | None = None
        self.sshd: ssh.Sshd | None = None
        self.rank_tag = ""  # the job's id, from the first host: the same on every host
        self._stopping = False
        self.ssh_port = ctx.settings.ssh_port
        self._keys: ssh.KeyPair | None = None  # the client key on the first host, this host's host key elsewhere
        self._ssh_dir: Path | None = None  # removed with everything in it when the job ends
        self._tripwire: Tripwire | None = None  # removes it, and ends sshd, should train be killed

    def _new_ssh_dir(self) -> Path:
        self._ssh_dir = ssh.new_ssh_dir()
        self._tripwire = Tripwire(directory=self._ssh_dir)
        return self._ssh_dir

    def introduction(self) -> dict[str, str]:
        keys_dir = self.ctx.settings.ssh_keys
        mounted = ssh.load_keys(keys_dir) if keys_dir else None
        if self.is_master:
            self._keys = mounted.client if mounted else ssh.generate_keypair(f"training-toolkit-client@{self.host}")
            return {INTRO_CLIENT_KEY: self._keys.public}
        self._keys = mounted.host if mounted else ssh.generate_keypair(f"training-toolkit-host@{self.host}")
        return {INTRO_HOST_KEY: self._keys.public}

    def prepare(self) -> None:
        assert self.membership is not None and self._keys is not None
        self.rank_tag = self.membership.job_id
        if self.is_master:
            return
        master = self.ctx.plan.hosts[0]
        client_public = _introduced(self.membership.introductions, master, INTRO_CLIENT_KEY)
        self.layout = ssh.write_server_side(
            self._new_ssh_dir(), host_key=self._keys, client_public=client_public, port=self.ssh_port,
            allowed_from=job_addresses(self.ctx.plan.hosts), user=_user(),
            listen_addresses=listen_addresses(self.ctx.job.resource.network_interface_name, self.host))
        self.sshd = ssh.Sshd(self.layout, sshd_path=self.ctx.settings.sshd)
        self.sshd.start()

    def after_barrier(self) -> None:
        assert self.membership is not None and self._keys is not None
        introductions = self.membership.introductions
        workers = self.ctx.plan.hosts[1:]
        host_keys = {host: _introduced(introductions, host, INTRO_HOST_KEY) for host in workers}
        self.layout = ssh.write_client_side(self._new_ssh_dir(), client_key=self._keys, host_keys=host_keys,
                                            port=self.ssh_port)
        ssh.wait_for_ssh(self.layout, workers, deadline_s=min(60.0, self.settings.join_timeout_s))

    def start(self) -> list[Local]:
        if not self.is_master:
            return []
        assert self.layout is not None
        env = self.job_env({**self.ctx.script_env, **smddp_env(self.ctx), RANK_TAG_VAR: self.rank_tag})
        command = build_command(self.ctx, self.layout, mpi_flavor(self.ctx.settings.mpi_flavor, self.ctx.environ), env)
        return [Local("mpirun", self.supervise(command, env, cwd=str(self.ctx.code_dir)), program=False)]

    def watched(self) -> list[stacks.Watched]:
        """This host's ranks (under mpirun here, under sshd elsewhere), each with its job-wide rank."""
        found = []
        for pid in self._ranks():
            rank = stacks.rank_of(pid)
            found.append(stacks.Watched(pid, rank, f"rank {rank}" if rank is not None else f"process {pid}"))
        return found

    def stop_part(self) -> None:
        """For a restart: this host's ranks get the stopping signal and the grace period; mpirun then ends."""
        stop_processes(self._ranks, self.ctx.grace_s, signal.SIGTERM)
        super().stop_part()

    def signal_job(self, signum: int) -> None:
        if signum not in STOPPING_SIGNALS:
            if self.locals:
                self._forward(signum, self.ctx.grace_s)  # mpirun passes SIGUSR1/2 to every rank
            return
        if self._stopping:
            return
        self._stopping = True
        threading.Thread(target=self._stop_ranks, args=(signum,), name="stop-ranks", daemon=True).start()

    def _ranks(self) -> list[int]:
        mpirun = frozenset(local.child.pid for local in self.locals)
        return procfs.marked_descendants(os.getpid(), f"{RANK_TAG_VAR}={self.rank_tag}".encode(), mpirun)

    def _stop_ranks(self, signum: int) -> None:
        """Signal this host's ranks, give them the grace period, then kill what is left."""
        stop_processes(self._ranks, self.ctx.grace_s, signum)
        self.events.put(PartStopped(signum, time.time()))  # a stopped job did not complete, whatever its ranks returned

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


def mpi_options(ctx: RunContext) -> MpiOptions:
    options = ctx.plan.options
    assert isinstance(options, MpiOptions), options
    return options


def describe(ctx: RunContext) -> dict:
    """The mpirun line the first host would run (for ``training-toolkit plan``); writes nothing, runs nothing.

    Without the flavour setting, ``mpirun --version`` decides at run time: the line shown is Open MPI 4's.
    """
    layout = ssh.SshLayout(Path("/run") / f"{ssh.layout.DIR_PREFIX}RANDOM", ctx.settings.ssh_port)
    env = {**ctx.script_env, **smddp_env(ctx)}
    flavor = ctx.settings.mpi_flavor
    shown = flavor or f"detected at run time (mpirun --version); the mpirun line shown is {OPENMPI4}'s"
    with_mpi4py = has_mpi4py(ctx.python, ask=False)
    return {"mpi_flavor": shown, "mpirun": build_command(ctx, layout, flavor or OPENMPI4, env, with_mpi4py)}


def _introduced(introductions, host: str, key: str) -> str:
    """A public key another host introduced, checked; a ClusterError naming the host if it did not."""
    line = introductions.get(host, {}).get(key)
    if not line:
        raise ClusterError(f"{host} did not introduce its {key.replace('_', ' ')} (a host of another toolkit version?)")
    return ssh.keys.check_public_line(line, f"{key.replace('_', ' ')} of {host}")


def job_addresses(hosts: Sequence[str]) -> list[str]:
    """Every address of the job's hosts: the only ones sshd admits the client key from."""
    found = sorted({address for host in hosts for address in netaddr.resolve(host)})
    if not found:
        raise ClusterError(f"none of the job's hosts resolves to an address: {', '.join(hosts)}")
    return found


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


def rank_command(ctx: RunContext, with_mpi4py: bool, smddprun: str | None = None) -> tuple[str, ...]:
    """What each rank runs: our wrapper, then the user's command (through mpi4py for Python).

    With the vendor's ``smddprun`` installed, the data parallel library's ranks go through it, as the reference does.
    """
    argv = list(ctx.argv)
    is_python = len(argv) >= 2 and argv[0] == ctx.python
    if is_python and with_mpi4py:
        argv = [argv[0], "-m", "mpi4py", *argv[1:]]
    if smddprun:
        argv = [smddprun, *argv]
    return (sys.executable, "-m", "training_toolkit.rank", "--base-dir", str(ctx.job.paths.base), "--", *argv)


def build_command(ctx: RunContext, layout: ssh.SshLayout, flavor: str, env: dict[str, str],
                  with_mpi4py: bool | None = None) -> list[str]:
    options = mpi_options(ctx)
    if with_mpi4py is None:
        with_mpi4py = has_mpi4py(ctx.python)
    job = MpiJob(
        hosts=ctx.plan.hosts,
        processes_per_host=options.processes_per_host,
        num_processes=options.num_processes,
        interface=ctx.job.resource.network_interface_name,
        rank_command=rank_command(ctx, with_mpi4py, shutil.which("smddprun") if options.smddp else None),
        forward_env=forwardable(list(env)),
        rsh_agent=tuple(ssh.ssh_command(layout)),
        custom_options=options.custom_mpi_options,
        as_root=os.geteuid() == 0,
    )
    return mpirun_command(job, flavor)


def describe_mpi_failure(tail: Sequence[str], hosts: Sequence[str], per_host: int, status: ExitStatus) -> str:
    """One line naming the rank, its host and the cause, from mpirun's own report and the ranks' stderr."""
    text = "\n".join(tail)
    rank: int | None = None
    host: str | None = None
    cause: str | None = None
    if match := _NOTICED.search(text):
        rank, host = int(match.group(1)), match.group(2)
        signum = int(match.group(3))
        cause = ExitStatus(-signum).describe()
    elif match := _ABORT.search(text):
        rank = int(match.group(1))
        cause = "called MPI_Abort"
    elif match := _FIRST.search(text):
        rank = int(match.group(1))
        code = _EXIT.search(text)
        cause = f"exited with code {code.group(1)}" if code else "exited with a non-zero code"
    last_error = _last_rank_error(tail, rank)
    if rank is None:
        # No rank started: the cause is the rsh agent's own line (ssh: Could not resolve hostname ...), which
        # Open MPI prints before its help text and row of dashes.
        agent = [line for line in tail if line.lstrip().startswith("ssh:")]
        return summary_line(f"{hosts[0]}: mpirun {status.describe()}", agent[-1:] or tail)
    host = host or (hosts[rank // per_host] if per_host and rank // per_host < len(hosts) else "?")
    line = f"rank {rank} on {host} {cause}"
    return f"{line}: {last_error}"[:900] if last_error else line


def _last_rank_error(tail: Sequence[str], rank: int | None) -> str | None:
    for line in reversed(tail):
        match = _TAGGED.match(line)
        if match and match.group(2) == "stderr" and not _ONLY_TAGS.match(match.group(3)):
            if rank is None or int(match.group(1)) == rank:
                return match.group(3).strip()
    return None
