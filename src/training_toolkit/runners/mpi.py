"""MPI: passwordless SSH between the hosts, ``mpirun`` from the attempt's lead (Horovod, mpi4py).

Every host joins the channel, fetches the code, writes the job's ssh directory and, unless it leads,
starts its own sshd (``mpi_ssh``), spares included; the lead waits until all are ready, checks it
can log in to each of the attempt's active hosts (each admits the job's keys once the go brought them
all), and runs mpirun over them (``mpi_launch``), whose daemons start one another over ssh (tree spawn).
Any member may lead an attempt: after the lead's loss the next lead runs mpirun, rank 0 on its host
(``agent/succession.py``); a host that led before and follows now starts its sshd then.  mpirun's
end is the job's end: its verdict goes to every host at once.  Every host writes its own ranks' command and
environment to a file (``rank_env``), rewritten for each attempt once its hosts are known: each
rank sees its own host's contract, and mpirun carries nothing of the job across the network.

Under Slurm (``TRAINING_TOOLKIT_MPI_LAUNCHER=slurm``, the Slurm platform's default) there is no
ssh at all: no keys, no sshd; mpirun starts its daemons with ``srun --overlap`` inside the job's
step (Open MPI's plm slurm), so a worker's ranks run under Slurm's step daemon, not under its
``train``, which knows them from their parents' reports as on every host (docs/slurm.md).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training_toolkit.supervise import procfs, rundir
from training_toolkit.cluster.netaddr import host_addresses, joined
from training_toolkit.cluster.guard import RUNTIME, GuardSpec
from training_toolkit.cluster.ssh.layout import DIR_PREFIX, SshLayout
from training_toolkit.core import names
from training_toolkit.core.names import LAUNCH_SLURM, OPENMPI4
from training_toolkit.core.redact import redact
from training_toolkit.runners import rank_env
from training_toolkit.runners.mpi_command import BLOCK_SIGTERM
from training_toolkit.runners.mpi_failure import mpirun_judge
from training_toolkit.runners.mpi_launch import (BTL_PORTS, PER_HOST_INTRO, RANK_TAG_VAR, build_command, has_mpi4py,
                                                 job_addresses, job_per_host, missing_home, mpi_flavor, mpi_options,
                                                 mpirun_preload, netshim, rank_environment, with_job_per_host,
                                                 slurm_environment, slurm_paths, user_command)
from training_toolkit.runners.mpi_ssh import SshPart
from training_toolkit.runners.netshim import PRELOAD, Shim
from training_toolkit.runspec import Proc, RunContext, RunnerSpec, Seating
from training_toolkit.supervise.deadman import Deadman


def spec(ctx: RunContext) -> RunnerSpec:
    """This host's part (``MpiHost``'s hooks); guarded: every listener of Open MPI's runtime, the ranks' BTL port range."""
    host = MpiHost(ctx)
    # through Slurm, a worker's daemon and ranks are not below its train: found by the stop flag's variable,
    # which mpirun's environment gives every daemon of this job (and so every rank)
    roots = host.daemons if host.via_slurm else None
    return RunnerSpec(host.start, guard=GuardSpec(ports=BTL_PORTS, every_port_of=RUNTIME, roots=roots),
                      introduction=host.introduction, prepare=host.prepare)


class MpiHost:
    """This host's part of an MPI job: what it holds (its ssh: ``SshPart``; its rank file), and its hooks (``spec``).

    Ranks run under mpirun and sshd (or Slurm's step daemon), not as ``train``'s children: each rank's parent,
    ``training-toolkit-rank``, reports it to its host's ``train`` (supervise/reported.py).  So the agent stops
    MPI's ranks as any runner's (agent/parts.py): a stopping signal on any host goes straight to that host's
    ranks, with the grace period so they can checkpoint, not through mpirun, whose own SIGTERM handling would
    kill every rank after a second (mpirun and the daemons start with SIGTERM blocked).  A rank's death, on the
    other hand, makes mpirun end the job at once (no kill timeout), except during a stop: then the agent's stop
    flag tells each rank's parent to hold the rank's end from the runtime (native/rank_exec.c), so that the
    first rank to end its handler does not end the others'.
    """

    def __init__(self, ctx: RunContext):
        self.ctx = ctx  # the job's hosts the lead's from ``prepare`` on (``Seating.ctx``)
        self.host = ctx.plan.current_host
        self.leads = ctx.plan.hosts[0] == self.host  # this host leads the last attempt (``start``)
        self.rank_tag = ""  # the job's id, from the lead: the same on every host
        self.via_slurm = ctx.settings.mpi_launcher == LAUNCH_SLURM  # daemons through srun: no ssh, no keys
        self._slurm_order = ctx.plan.hosts  # the platform's: under Slurm, the step's nodes in Slurm's order
        self.ssh = None if self.via_slurm else SshPart(self.host, ctx.settings, ctx.environ)
        self._command: tuple[str, ...] = ()  # what each rank runs after the rank program (``user_command``)
        self._shim: Shim | None = None  # the daemons' accept() shim, with the job's addresses resolved once (prepare)
        self._rank_file: Path | None = None  # this host's ranks' command and environment; removed at the end
        self._rank_tripwire: Deadman | None = None  # removes it, and ends this host's ranks, should train be killed
        self._per_host: int | None = None  # the lead's ranks per host, where this host's job names none

    def introduction(self) -> dict[str, str]:
        own = {PER_HOST_INTRO: str(mpi_options(self.ctx).processes_per_host)}
        return {**(self.ssh.introduction() if self.ssh is not None else {}), **own}

    def _job_per_host(self, seat: Seating) -> int | None:
        """``job_per_host`` for this host, from the lead's introduction (its first lead's, at the first barrier)."""
        said = (seat.introductions or {}).get(seat.attempt.lead, {}).get(PER_HOST_INTRO, "")
        named = names.MPI_PROCESSES_PER_HOST in seat.ctx.job.framework_params
        return job_per_host(named, seat.leads, said)

    def _as_the_job_runs(self, ctx: RunContext) -> RunContext:
        """``ctx`` with the job's ranks per host (``_job_per_host``), as every host's mpirun and ranks see it."""
        return with_job_per_host(ctx, self._per_host)

    @contextmanager
    def prepare(self, seat: Seating) -> Iterator[None]:
        """What this host makes for the job (ssh directory, sshd, rank file, their tripwires): gone when it ends,
        or when making it failed half way."""
        try:
            self._make(seat)
            yield
        finally:
            self.cleanup()

    def _make(self, seat: Seating) -> None:
        """Every host, spares included (a spare may be seated later): the rank file's place, and sshd on a host that
        does not lead, admitting nobody until an attempt names its hosts (``start``: their keys, from the go)."""
        self._per_host = self._job_per_host(seat)
        self.ctx = self._as_the_job_runs(seat.ctx)
        self.rank_tag = seat.job_id
        self._command = user_command(self.ctx, has_mpi4py(self.ctx.python, self.ctx.environ))
        # the daemons' shim (sshd's sessions) and sshd's from= (each host's own, for its key) resolved once
        by_host = host_addresses(self.ctx.plan.hosts) if self.ssh is not None and not seat.leads else None
        self._shim = netshim(self.ctx, None if by_host is None else tuple(joined(by_host)))
        self._write_rank_file(seat)
        if self.ssh is None:
            return
        assert self._rank_file is not None
        shim = self._shim
        # the daemons mpirun starts through this sshd: this host's ranks' file and the shim, set by this host (sshd's
        # sessions get nothing else)
        session_env = {rank_env.RANK_FILE_VAR: str(self._rank_file),
                       **({PRELOAD: shim.library, **shim.environment()} if shim else {})}
        self.ssh.prepare(seat, session_env, by_host)

    def _write_rank_file(self, seat: Seating) -> None:
        """This host's ranks' file, at a path of its own: of no attempt yet, so no rank starts from it (``start``)."""
        # through Slurm every daemon gets mpirun's one environment: each host's directory is named after its node,
        # and the daemons find theirs from a path they complete with their own node's name (slurm_paths)
        where = rundir.parent(seat.ctx.environ)
        path = self._rank_file = (rank_env.node_rank_file_path(self.rank_tag, self.host, where) if self.via_slurm
                                  else rank_env.new_rank_file_path(self.rank_tag, where))
        self._rank_tripwire = Deadman([f"{RANK_TAG_VAR}={self.rank_tag}"], [path.parent])
        rank_env.write_rank_file(path, self._rank_file_data(seat, self._shim, attempt=None))

    def _rank_file_data(self, seat: Seating, shim: Shim | None, attempt: int | None) -> bytes:
        # the attempt and the stall watch's variables (the agent's job_env) are this host's too
        ctx = self._as_the_job_runs(seat.ctx)
        env = rank_environment(ctx, self.rank_tag, seat.job_env(ctx.script_env), shim, attempt=attempt)
        return rank_env.encode_rank_file(str(ctx.code_dir), self._command, env)

    def _seat_attempt(self, seat: Seating) -> Shim | None:
        """An active host, once the attempt's hosts are known: its ranks' file, its shim and sshd's from= name them.

        ``seat.ctx`` is the attempt's (its active hosts in rank order: ``SM_HOSTS``, ``SM_TRAINING_ENV``,
        ``SM_RESOURCE_CONFIG``); a worker's sshd then admits those hosts' client keys, each from its own
        addresses, and pins their host keys (``SshPart.trust``: tree spawn); a spare (never asked) admits nobody.
        Once the attempt has ended here, sshd admits nobody (``SshPart.shut``) until the next go's keys are written,
        so the next lead's probe finds a host ready only once it is.  The rank file is rewritten for each attempt;
        a rank of a new attempt that starts before then waits for it (``training-toolkit-rank --attempt``).
        """
        assert self._rank_file is not None and seat.at_attempt_end is not None
        addresses = tuple(job_addresses(seat.ctx.plan.hosts))
        shim = netshim(seat.ctx, addresses)
        if self.ssh is not None:
            seat.at_attempt_end(self.ssh.shut)
            if not seat.leads:
                self.ssh.trust(seat)
        rank_env.rewrite_rank_file(self._rank_file, self._rank_file_data(seat, shim, attempt=seat.attempt.number))
        return shim

    def start(self, seat: Seating) -> list[Proc]:
        """The attempt's processes (an active host only): mpirun on the lead, over the attempt's hosts."""
        shim = self._seat_attempt(seat)
        self.leads = seat.leads
        if not seat.leads:
            return []
        ctx = self._as_the_job_runs(seat.ctx)
        assert self._rank_file is not None
        if self.ssh is not None:  # every other active host answers, with this attempt's keys written
            self.ssh.lead(seat)
        flavor = mpi_flavor(ctx.settings.mpi_flavor, ctx.environ)
        command = build_command(ctx, self.ssh.layout if self.ssh else None, flavor, seat.attempt.number)
        command = [*BLOCK_SIGTERM, *command]  # what the plan shows, started with SIGTERM blocked
        preload, extra = mpirun_preload(ctx, shim)
        extra[rank_env.RANK_FILE_VAR] = str(self._rank_file)  # for the ranks it starts on this host
        if self.ssh is not None:
            extra.update(self.ssh.agent_environment())  # its rsh agent's config (native/ssh_agent.c)
        if self.via_slurm:
            extra.update(slurm_environment(ctx, self._slurm_order))
            extra.update(slurm_paths(self._rank_file, self.host))
            extra.update(missing_home(ctx.environ))
        env = rank_env.mpirun_environment(ctx.environ, preload, extra)
        judge = mpirun_judge(ctx.plan.hosts, mpi_options(ctx).processes_per_host)  # the attempt's ranks, by host
        return [Proc("mpirun", tuple(command), env, str(ctx.code_dir), program=False, judge=judge)]

    def daemons(self) -> list[int]:
        """Through Slurm: this host's Open MPI daemon (what mpirun's environment marks), for the listener guard; its
        ranks' parents below it carry the same mark (the guard walks a root already below another once)."""
        if self._rank_file is None:
            return []
        path = slurm_paths(self._rank_file, self.host)[rank_env.RANK_FILE_VAR]
        return procfs.marked(f"{rank_env.RANK_FILE_VAR}={path}".encode()) if not self.leads else []

    def cleanup(self) -> None:
        if self.ssh is not None:
            self.ssh.close()
        if self._rank_file is not None:
            shutil.rmtree(self._rank_file.parent, ignore_errors=True)
        if self._rank_tripwire is not None:
            self._rank_tripwire.disarm()


def describe(ctx: RunContext) -> dict:
    """The mpirun line the lead would run (for ``training-toolkit plan``); writes nothing, runs nothing.

    Without the flavour setting, ``mpirun --version`` decides at run time: the line shown is Open MPI 4's.
    """
    parent = rundir.parent(ctx.environ)
    via_slurm = ctx.settings.mpi_launcher == LAUNCH_SLURM
    layout = None if via_slurm else SshLayout(parent / f"{DIR_PREFIX}RANDOM", ctx.settings.ssh_port)
    rank_file = parent / f"{rank_env.DIR_PREFIX}JOBID-RANDOM" / rank_env.FILE_NAME
    flavor = ctx.settings.mpi_flavor
    shown = flavor or f"detected at run time (mpirun --version); the mpirun line shown is {OPENMPI4}'s"
    ranks = rank_environment(ctx, "JOBID", shim=netshim(ctx, addresses=("ADDRESSES",), shown_only=True),
                             attempt=ctx.first_attempt)
    return {"mpi_flavor": shown, "mpi_launcher": ctx.settings.mpi_launcher,
            "mpirun": build_command(ctx, layout, flavor or OPENMPI4, ctx.first_attempt),
            **({"mpirun_slurm_environment": slurm_environment(ctx)} if via_slurm else {}),
            "rank_file": f"{rank_env.RANK_FILE_VAR}={rank_file} (each host's own)",
            "rank_command": user_command(ctx, has_mpi4py(ctx.python, ctx.environ, ask=False)),
            "rank_environment_added": redact({k: v for k, v in ranks.items() if ctx.script_env.get(k) != v})}
