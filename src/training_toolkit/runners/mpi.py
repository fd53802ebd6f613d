"""MPI: passwordless SSH between the hosts, ``mpirun`` from the first host (Horovod, mpi4py).

Every host joins the channel, fetches the code, writes the job's ssh directory
and starts its own sshd; the first host waits until all are ready, checks it
can log in to each, and runs mpirun.  mpirun's end is the job's end: its
verdict goes to every host at once.  Ranks go through ``training_toolkit.rank``
so that each sees its own host's contract.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from training_toolkit import procfs
from training_toolkit.agent import HostAgent, Local, PartStopped
from training_toolkit.cluster import ssh
from training_toolkit.errors import ClusterError, ConfigError
from training_toolkit.process import STOPPING_SIGNALS, ExitStatus, Supervised
from training_toolkit.report import Outcome, summary_line
from training_toolkit.runners.base import RunContext
from training_toolkit.runners.mpi_command import (
    OPENMPI4,
    OPENMPI5,
    MpiJob,
    forwardable,
    mpirun_command,
    parse_custom_options,
)
from training_toolkit.stopping import stop_processes

DEFAULT_SSH_PORT = 22
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


RANK_TAG_VAR = "TRAINING_TOOLKIT_RANK_TAG"  # forwarded to every rank: how each host finds its own ranks


class MpiAgent(HostAgent):
    """Ranks run under mpirun and sshd, not as our children; signals reach them through ``rank_tag``.

    A stopping signal on any host goes straight to that host's ranks (with the
    grace period, so they can checkpoint), not through mpirun, whose own
    SIGTERM handling would kill every rank after a second.  A rank's death, on
    the other hand, makes mpirun end the job at once (no kill timeout).
    """

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.layout: ssh.SshLayout | None = None
        self.sshd: ssh.Sshd | None = None
        self.rank_tag = hashlib.sha256(b"training-toolkit ranks\0" + self.secret.value).hexdigest()[:16]
        self._stopping = False
        port = ctx.environ.get("TRAINING_TOOLKIT_SSH_PORT", str(DEFAULT_SSH_PORT))
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("environment variable TRAINING_TOOLKIT_SSH_PORT", None, f"expected a port, got {port!r}")
        self.ssh_port = int(port)

    def prepare(self) -> None:
        keys_dir = self.ctx.environ.get("TRAINING_TOOLKIT_SSH_KEYS")
        keys = ssh.load_keys(Path(keys_dir)) if keys_dir else ssh.derive_keys(self.secret.value)
        self.layout = ssh.write_ssh_dir(ssh_dir(self.secret.value), keys, self.ctx.plan.hosts, port=self.ssh_port)
        if not self.is_master:
            self.sshd = ssh.Sshd(self.layout, sshd_path=self.ctx.environ.get("TRAINING_TOOLKIT_SSHD") or None)
            self.sshd.start()

    def after_barrier(self) -> None:
        assert self.layout is not None
        ssh.wait_for_ssh(self.layout, self.ctx.plan.hosts[1:], deadline_s=min(60.0, self.settings.join_timeout_s))

    def start(self) -> list[Local]:
        if not self.is_master:
            return []
        assert self.layout is not None
        env = {**self.ctx.script_env, **data_parallel_env(self.ctx), RANK_TAG_VAR: self.rank_tag}
        command = build_command(self.ctx, self.layout, mpi_flavor(self.ctx.environ), env)
        return [Local("mpirun", Supervised(command, env, cwd=str(self.ctx.code_dir)))]

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
        self.events.put(PartStopped(signum))  # a stopped job did not complete, whatever its ranks returned

    def failure_of(self, local: Local, status: ExitStatus) -> Outcome:
        tail = tuple(local.child.tail.lines(100))
        options = self.ctx.plan.options
        reason = describe_mpi_failure(tail, self.ctx.plan.hosts, options["processes_per_host"], status)
        return Outcome(status.exit_code, reason, tuple(local.child.argv), tail)

    def cleanup(self) -> None:
        if self.sshd is not None:
            self.sshd.stop()
        if self.layout is not None:
            shutil.rmtree(self.layout.directory, ignore_errors=True)


def describe(ctx: RunContext) -> dict:
    """The mpirun line the first host would run (for ``training-toolkit plan``); writes nothing."""
    from training_toolkit.cluster.secret import job_secret

    layout = ssh.SshLayout(ssh_dir(job_secret(ctx.job, ctx.environ).value), DEFAULT_SSH_PORT)
    env = {**ctx.script_env, **data_parallel_env(ctx)}
    return {"mpirun": build_command(ctx, layout, mpi_flavor(ctx.environ), env)}


def ssh_dir(secret: bytes) -> Path:
    """The same path on every host (the rsh agent string names it), private to this job."""
    tag = hashlib.sha256(b"training-toolkit ssh dir\0" + secret).hexdigest()[:16]
    base = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    return base / f"training-toolkit-{tag}" / "ssh"


def mpi_flavor(environ) -> str:
    forced = environ.get("TRAINING_TOOLKIT_MPI_FLAVOR")
    if forced:
        return forced
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20, env=dict(environ))
    except FileNotFoundError:
        raise ClusterError("mpirun not found on PATH (install Open MPI)") from None
    except subprocess.TimeoutExpired:
        raise ClusterError("mpirun --version did not answer within 20 s") from None
    match = re.search(r"Open MPI\)?\s+(\d+)\.", out.stdout + out.stderr)
    return OPENMPI5 if match and int(match.group(1)) >= 5 else OPENMPI4


def has_mpi4py(python: str) -> bool:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return importlib.util.find_spec("mpi4py") is not None
    try:
        return subprocess.run([python, "-c", "import mpi4py"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def data_parallel_env(ctx: RunContext) -> dict[str, str]:
    """What the data-parallel library's launcher sets for its ranks (reference: smdataparallel)."""
    if not ctx.plan.options.get("data_parallel"):
        return {}
    return {"SMDATAPARALLEL_USE_HOMOGENEOUS": "0" if ctx.job.is_hetero else "1", "MASTER_ADDR": ctx.plan.hosts[0],
            "MASTER_PORT": ctx.environ.get("MASTER_PORT", "29500")}


def rank_command(ctx: RunContext, with_mpi4py: bool, smddprun: str | None = None) -> tuple[str, ...]:
    """What each rank runs: our wrapper, then the user's command (through mpi4py for Python).

    With the vendor's ``smddprun`` installed, data-parallel ranks go through it, as the reference does.
    """
    argv = list(ctx.argv)
    is_python = len(argv) >= 2 and argv[0] == ctx.python
    if is_python and with_mpi4py:
        argv = [argv[0], "-m", "mpi4py", *argv[1:]]
    if smddprun:
        argv = [smddprun, *argv]
    return (sys.executable, "-m", "training_toolkit.rank", "--base-dir", str(ctx.job.paths.base), "--", *argv)


def build_command(ctx: RunContext, layout: ssh.SshLayout, flavor: str, env: dict[str, str]) -> list[str]:
    options = ctx.plan.options
    source = str(ctx.job.paths.hyperparameters_file)
    job = MpiJob(
        hosts=ctx.plan.hosts,
        processes_per_host=options["processes_per_host"],
        num_processes=options["num_processes"],
        interface=ctx.job.resource.network_interface_name,
        rank_command=rank_command(ctx, has_mpi4py(ctx.python),
                                  shutil.which("smddprun") if options.get("data_parallel") else None),
        forward_env=forwardable(list(env)),
        rsh_agent=tuple(ssh.ssh_command(layout)),
        custom_options=parse_custom_options(options["custom_mpi_options"], source),
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
        return summary_line(f"{hosts[0]}: mpirun {status.describe()}", tail)
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
