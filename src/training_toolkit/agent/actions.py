"""Carrying out what the step said (``decisions.Action``): the agent's one place that acts on its actions.

Each action is a call on the seat (tell the job), on this host's part (pass a
signal on, stop for a restart), on the stall watch (stacks, in a thread of
their own), or the end: ``Finish`` returns the outcome, ``Rejoin`` runs the
next attempt's barrier and start, ``Interrupt`` abandons setup (``Stopped``).
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from training_toolkit.agent.events import (Action, Announce, AnnounceRestart, EndLaunchers, FailOver, Finish, Forward, GatherStacks,
                                           Interrupt, Rejoin, Report, ReportDone, Say, SendStacks, ShareMark, ShareProgress, StopPart)
from training_toolkit.agent.parts import in_thread
from training_toolkit.core.errors import CodeError, JobFailed, ToolkitError
from training_toolkit.core.log import log
from training_toolkit.core.records import replace
from training_toolkit.job.report import Outcome

if TYPE_CHECKING:  # a type only: building a Protocol class costs every launch
    from typing import Protocol

    from training_toolkit.agent.parts import Part
    from training_toolkit.agent.recording import Recorder
    from training_toolkit.agent.stall import StallWatch
    from training_toolkit.cluster.seat import Seat
    from training_toolkit.runspec import Local

    class Agent(Protocol):
        """What carrying out needs of the loop (``loop.HostAgent``): its seat, part, stall watch, the next attempt."""

        membership: Seat | None
        part: Part
        stall: StallWatch
        recorder: Recorder
        host: str

        @property
        def hosts(self) -> tuple[str, ...]: ...

        @property
        def locals(self) -> Sequence[Local]: ...

        def rejoin(self, attempt: int, reason: str) -> Outcome | None: ...

        def fail_over(self, attempt: int, reason: str, lost: str) -> Outcome | None: ...


class Stopped(ToolkitError):
    """A stopping signal arrived before the job started."""

    def __init__(self, signum: int):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before the job started")


class Ended(Exception):
    """The step ended the job during setup (the lead's barrier failed): ``outcome`` is the verdict, told."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.reason)
        self.outcome = outcome


def carry_out(agent: Agent, actions: tuple[Action, ...]) -> Outcome | None:
    """Do what the step said; the outcome once it says this host is done."""
    seat = agent.membership
    assert seat is not None
    for action in actions:
        if isinstance(action, Forward):
            agent.part.signal(action.signum)
        elif isinstance(action, EndLaunchers):
            agent.part.end_launchers()
        elif isinstance(action, Announce):  # with the job's cost, which every host's log says (``record``)
            seat.announce(replace(action.verdict, summary=agent.recorder.summary_line()), linger=action.linger)
        elif isinstance(action, Report):
            seat.report_failure(action.reason, action.exit_code, action.at, action.attempt, action.stopped)
        elif isinstance(action, ShareProgress):
            seat.progress(action.heartbeat, action.checkpoint)
        elif isinstance(action, ShareMark):
            seat.share_mark(action.host, action.attempt)
        elif isinstance(action, GatherStacks):
            in_thread(agent.stall.gather, "gather-stacks", seat, agent.host, agent.hosts, list(agent.locals))
        elif isinstance(action, SendStacks):
            in_thread(agent.stall.send, "send-stacks", seat, agent.host, list(agent.locals))
        elif isinstance(action, AnnounceRestart):
            seat.restart(action.attempt, action.reason, action.cause)
        elif isinstance(action, StopPart):
            agent.part.stop_for_restart(action.attempt)
        elif isinstance(action, Say):
            log(action.line)
        elif isinstance(action, Rejoin):
            return agent.rejoin(action.attempt, action.reason)
        elif isinstance(action, FailOver):
            return agent.fail_over(action.attempt, action.reason, action.lost)
        elif isinstance(action, ReportDone):
            seat.report_done(action.exit_code)
        elif isinstance(action, Interrupt):
            raise Stopped(action.signum)
        elif isinstance(action, Finish):
            return action.outcome
    return None


def setup_failure(host: str, solo: bool, exc: ToolkitError) -> str:
    """A setup failure's reason, naming this host (a job of one seat names none, as the reference)."""
    return str(exc) if isinstance(exc, JobFailed) or solo else named(host, exc)


def cannot_start(argv: Sequence[str], solo: bool, exc: OSError, env: Mapping[str, str] | None = None) -> CodeError:
    """A program that could not be started, as a setup failure; ``env``: the script's environment, whose too long
    entry (a hyperparameter's value in ``SM_HPS``, say) is named where the exec said E2BIG."""
    why = str(exc.strerror or exc)
    if exc.errno == errno.E2BIG:
        why += f": {too_long(argv, env or {})}"
    if solo:  # the user's script, as the reference says it
        return CodeError(f"cannot run {argv[0]}: {why}")
    return CodeError(f"cannot start {exc.filename or 'a process'}: {why}")


#: Linux's limit on one argument or one environment entry (``MAX_ARG_STRLEN``, 32 pages): a longer one fails the exec
ARG_LIMIT = 32 * 4096


def too_long(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """Why an exec said E2BIG: the longest of the arguments and environment entries, if over ``ARG_LIMIT``.  Pure."""
    entries = [(f"the variable {name}", len(f"{name}={value}".encode(errors="surrogateescape")) + 1)
               for name, value in env.items()]
    entries += [(f"the argument after {argv[i - 1]}" if i and argv[i - 1].startswith("-") else f"argument {i}",
                 len(arg.encode(errors="surrogateescape")) + 1) for i, arg in enumerate(argv)]
    what, size = max(entries, key=lambda entry: entry[1], default=("", 0))
    if size > ARG_LIMIT:
        return f"{what} is {size:,} bytes, over Linux's limit of {ARG_LIMIT:,} for one (a hyperparameter too long?)"
    return "the arguments and the environment together are over the system's limit"


def named(host: str, error: Exception) -> str:
    """An error's message as a job-wide reason: it starts with the host it happened on."""
    text = str(error)
    return text if text.startswith(f"{host}:") else f"{host}: {text}"
