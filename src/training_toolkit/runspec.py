"""The seam between the agent and the runners: what a runner is given, and the value it gives back.

A runner (``runners/``, one module each) imports nothing of the agent, and the
agent nothing of a runner: ``cli`` looks the runner up (``runners.runner``),
asks it for its ``RunnerSpec`` and hands that to the agent (``agent.run``).

- ``RunContext``: the job as this host sees it (``with_hosts``: its hosts as the lead gave them, checked), and
  as an attempt runs it (``for_attempt``: computed from the job and the ``Attempt``); the job is parsed once.
- ``Seating``: the attempt's membership as a runner sees it: the job, the ``Attempt``
  (``job/attempt.py``), the channel's introductions, what every process of the attempt gets.
- ``Proc``: a process to start (argv, env, cwd, its rank, whether its end ends this
  host's part, whether it runs the user's program, how its end is told where its output says more than its
  status: mpirun's); ``Local``: one the agent started.
- ``Blamed``: a failed exit as its process tells it: its outcome, and the host whose own processes failed.
- ``RunnerSpec``: the processes of an attempt (``processes``), what the runner makes and holds for
  the job (``prepare``: a context manager the agent enters on its per-job ``ExitStack``), the
  listeners the guard covers, and the few hooks a runner needs, as plain callables.  Every hook may be left out.
  How a host's part stops is the agent's, the same for every runner (``agent/parts.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from training_toolkit.job.attempt import Attempt
from training_toolkit.core.errors import ToolkitError
from training_toolkit.job.spec import JobSpec
from training_toolkit.job.plan import LaunchPlan
from training_toolkit.supervise.process import ExitStatus, Supervised
from training_toolkit.core.records import record
from training_toolkit.job.report import Outcome, summary_line
from training_toolkit.config.settings import Settings

if TYPE_CHECKING:  # the guard is imported only where a runner names listeners to guard
    from contextlib import AbstractContextManager

    from training_toolkit.cluster.guard import GuardSpec


class RunContext(NamedTuple):
    job: JobSpec
    plan: LaunchPlan
    settings: Settings  # parsed once at the start: runners read settings here, never from ``environ``
    environ: Mapping[str, str]  # the toolkit's own environment, as read at start (for its children)
    script_env: Mapping[str, str]  # the user script's environment (contract applied)
    argv: tuple[str, ...]  # the user's command with its arguments
    code_dir: Path
    python: str
    setup_error: ToolkitError | None = None  # this host cannot take part (its code did not install): the
    #                                          agent joins the job to say so, as a failure of its setup
    first_attempt: int = 0  # the platform's word on restarts (JobSet's restart-attempt): the job's attempts start there


    @property
    def grace_s(self) -> float:
        return self.settings.grace_s


@record
class Seating:
    """The attempt's membership as a runner sees it; the agent makes a new one for each hook it calls.

    ``ctx``: the job's every host (what a runner holds for the job), or the attempt's own (``for_attempt``: what
    its processes see); a runner reads peers from here only.  ``attempt``: the barrier's outcome (before the first
    barrier, every host, the lead rank order's first).
    ``job_env(env)``: ``env`` with what every process of the attempt gets (the attempt, the stall
    watch's hook), for processes the agent does not start itself (MPI's ranks, from the rank file).
    ``at_attempt_end(undo)``: given to ``processes`` only: ``undo`` runs once this attempt has ended on this host,
    after its processes (before the next attempt's barrier, or at the job's end): what the runner set up for the
    attempt alone (MPI: sshd admitting the attempt's launchers) is let go with it.
    """

    ctx: RunContext
    attempt: Attempt
    job_id: str = ""  # the same on every host (empty: a job of one seat)
    introductions: Mapping[str, Mapping[str, str]] | None = None  # what each host told when it joined
    job_env: Callable[[Mapping[str, str]], dict[str, str]] = dict
    join_timeout_s: float = 0.0
    at_attempt_end: Callable[[Callable[[], None]], object] | None = None

    @property
    def host(self) -> str:
        return self.ctx.plan.current_host

    @property
    def leads(self) -> bool:
        """This host leads the attempt (its barrier, its verdict, and every runner's coordinator)."""
        return self.attempt.leads(self.host)


#: How a process's end is told: None, a success; else the failure (a launcher's exit 0 may be one: mpirun's after
#: it lost a daemon).  Given the process and its exit status.
Judge = Callable[["Local", ExitStatus], "Blamed | None"]


@record
class Proc:
    """A process of the attempt on this host, as the runner asks for it; the agent starts and watches it."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None
    rank: int | None = None  # the job-wide rank it is (its failure names it)
    primary: bool = True  # this host's part ends when its primaries end
    program: bool = True  # it runs the user's command (a failure names the program; a stop signals it), else it
    #                       is one of the toolkit's (``name``: mpirun, the parameter server), ended after the programs
    judge: Judge | None = None  # how its end is told, from its output as well (mpirun's: the failing rank's host);
    #                             default: its status, a failure named by ``failure_of``


@record
class Local:
    """A process this host runs for the job (a started ``Proc``): its name, its child, and the ``Proc``'s flags."""

    name: str
    child: Supervised
    primary: bool = True
    rank: int | None = None
    program: bool = True
    judge: Judge | None = None


@record
class Blamed:
    """A failed exit as its process tells it (``Proc.judge``): its outcome, and whose own processes failed.

    ``host`` None: this host's (every runner whose failing processes are its host's own).  MPI's mpirun runs on
    the lead for every rank: its failure names the failing rank's host, which the retire rule
    (``roster.to_retire``) counts, not the lead.
    """

    outcome: Outcome
    host: str | None = None


@record
class RunnerSpec:
    """What a runner is on one host: a value, built by the runner module's ``spec(ctx)`` before the job is joined.

    Only ``processes`` is needed; every other field has the default every runner had before it
    needed otherwise.  Hooks that take a ``Seating`` see the attempt's membership at that point.
    """

    processes: Callable[[Seating], Sequence[Proc]]  # this attempt's processes on this host (may be none)
    wait_for_peers: bool = False  # on success, does the lead wait for every host's own success?
    solo: bool = False  # a job of one seat, as the reference's: no channel, no port, its reasons name no host, and
    #                     stopped by a signal, the script's own exit is the verdict (a script that saved and exited 0)
    guard: GuardSpec | Callable[[Seating], GuardSpec | None] | None = None  # the listeners only the job's hosts may
    #   reach (cluster/guard.py); a callable is asked after barrier 0, for a spec that depends on what ``prepare`` made
    introduction: Callable[[], Mapping[str, str]] | None = None  # told the others on joining; public facts only
    prepare: Callable[[Seating], AbstractContextManager[Any]] | None = None  # after joining, before barrier 0 (every
    #   host): what the runner checks (a port free) and makes for the job (sshd, keys, rank file), a context manager
    #   entered on the agent's per-job stack: what it made is let go once every process is gone


def introduced_count(said: str) -> int | None:
    """A count of processes per host as a host introduced it (input from the wire: MPI's, torch's), if it is one:
    ASCII digits, from 1 to the most ranks a host runs (``reported.MAX_REPORTS``); else None."""
    from training_toolkit.supervise.reported import MAX_REPORTS

    return int(said) if said.isascii() and said.isdigit() and 0 < int(said) <= MAX_REPORTS else None


def failure_of(local: Local, status: ExitStatus, host: str | None) -> Outcome:
    """The outcome of a local process that failed, its reason naming ``host`` (None: a job of one seat names none)."""
    if host is None:
        return outcome_of(local.child, status)
    if local.rank is not None:
        return outcome_of(local.child, status, label=f"{host} rank {local.rank}")
    return outcome_of(local.child, status, label=host, what=None if local.program else local.name)


def with_hosts(ctx: RunContext, hosts: tuple[str, ...]) -> RunContext:
    """``ctx`` for the job's hosts as the lead gave them (once, at the join: a host's own view may be partial).

    The lead's list is input from the wire: it is checked by the resource config's rule for hosts
    (``job.with_hosts``); the runner and its options stay as parsed at the start, fitted to the hosts' count.
    """
    from training_toolkit.job import contract
    from training_toolkit.job import spec as job
    from training_toolkit.job import plan

    spec = job.with_hosts(ctx.job, hosts)
    if spec is ctx.job:
        return ctx
    return with_job(ctx, spec, plan.for_hosts(ctx.plan, contract.participating_hosts(spec),
                                             str(ctx.job.paths.hyperparameters_file)))


def for_attempt(ctx: RunContext, attempt: Attempt) -> RunContext:
    """``ctx`` as ``attempt`` runs the job: its active hosts in rank order, the lead first.  Pure.

    Everything a rank sees (``SM_HOSTS``, ``SM_TRAINING_ENV``, ``SM_RESOURCE_CONFIG``) and everything
    that addresses or admits peers (the plan's hosts: the hostfile, ``TF_CONFIG``, ``MASTER_ADDR``, the
    shim, sshd's ``from=``) is computed from the job and the attempt: the job is not parsed again, the
    runner's options are fitted to the hosts' count (``plan.for_hosts``).  Only an active host runs it.
    """
    from training_toolkit.job import spec as job
    from training_toolkit.job import plan

    if attempt.active == ctx.plan.hosts:
        return ctx
    return with_job(ctx, job.on_hosts(ctx.job, attempt.active),
                    plan.for_hosts(ctx.plan, attempt.active, str(ctx.job.paths.hyperparameters_file)))


def with_job(ctx: RunContext, spec: JobSpec, fitted: LaunchPlan) -> RunContext:
    """``ctx`` for ``spec`` run as ``fitted`` says: the script's environment computed again from them (it is the
    contract's function of the job, never carried over).  Pure."""
    from training_toolkit.job import contract

    return ctx._replace(job=spec, plan=fitted, script_env=contract.script_environment(spec, ctx.environ))


def write_resource_config(spec: JobSpec) -> None:
    """``/opt/ml``'s resource config as ``spec`` has it (its hosts: the job's, or an attempt's active hosts): what a
    script that reads the file (not ``SM_RESOURCE_CONFIG``) sees."""
    _write_json(spec.paths.resource_config_file, dict(spec.resource.raw))


def _write_json(path: Path, value: Mapping) -> None:
    import json
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)


def outcome_of(child: Supervised, status: ExitStatus, label: str = "", what: str | None = None) -> Outcome:
    """A failed process's outcome names how it ended and its last stderr line."""
    if status.ok:
        return Outcome(0)
    child.drain()  # the exit can be seen before the relay has read the last stderr lines
    tail = tuple(child.tail.lines(100))
    prefix = f"{label}: " if label else ""
    description = f"{prefix}{what or _program(child.argv)} {status.describe()}"
    return Outcome(status.exit_code, summary_line(description, tail), tuple(child.argv), tail)


def _program(argv: list[str]) -> str:
    if len(argv) >= 3 and argv[1] == "-m":
        return f"python -m {argv[2]}"
    if len(argv) >= 2 and Path(argv[0]).name.startswith("python"):
        return Path(argv[1]).name
    return Path(argv[0]).name if argv else "script"
