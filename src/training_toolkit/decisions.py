"""The agent's decisions: a pure step over events, ``step(state, event, now) -> (state, actions)``.

What a local exit, a peer's report, a signal or the passing of time means for
this host, when the job is over and what every host is told, decided here
without processes, sockets or clocks of its own, so that every rule is a row
in a table test (test/unit/test_decisions.py).  ``agent.HostAgent`` is the
shell: it turns what happens into events, feeds them to ``step`` and carries
out the actions.

The root cause is the earliest failure, not the first report to arrive (as
torch elastic orders failures by timestamp): every failure carries ``at``, the
wall clock (``time.time()``) where it happened.  The first host, on the first
failure it hears of, waits ``FAILURE_WINDOW_S`` more for reports of failures
that happened earlier but arrive later (a worker's report crosses the network
and waits for the failed process's last stderr lines), then names the earliest.
A failure whose time is not known (``at`` None) ranks after every known one;
equal times rank by arrival.

``now`` is the shell's monotonic clock: deadlines in the state are on it, and
a ``Tick`` tells the step that time has passed.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace
from typing import Union

from training_toolkit.cluster.channel import PeerDone, PeerFailed, PeerLost, Verdict
from training_toolkit.errors import EXIT_CLUSTER_ERROR
from training_toolkit.process import STOPPING_SIGNALS, ExitStatus
from training_toolkit.report import Outcome

FAILURE_WINDOW_S = 0.5  # first host: after the first failure, how long earlier-stamped reports may take to arrive
REPORT_WAIT_S = 5.0  # other hosts: after reporting a failure, how long to wait for the verdict before ending alone
PEER_FINISH_TIMEOUT_S = 600.0  # first host: after its own success, how long the others may take (wait_for_peers)

# Phases: setting up (join, prepare, barrier, start), running (monitoring), ended (the outcome is known)
SETUP, RUNNING, ENDED = "setup", "running", "ended"


# Events: what happened ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalExit:
    """A local process ended; ``failure`` is the runner's description of a failed exit (None if it did not fail)."""

    name: str
    status: ExitStatus
    at: float | None = None  # wall clock when its end was seen
    failure: Outcome | None = None


@dataclass(frozen=True)
class GotSignal:
    signum: int


@dataclass(frozen=True)
class PartStopped:
    """A runner's own report: this host's part of the job was stopped by a signal."""

    signum: int
    at: float | None = None


@dataclass(frozen=True)
class Started:
    """Setup is over; ``primaries`` are the local processes whose ends end this host's part."""

    primaries: tuple[str, ...]


@dataclass(frozen=True)
class SetupFailed:
    """Setup failed (join, prepare, barrier, start); ``outcome`` names the cause."""

    outcome: Outcome
    at: float | None = None


@dataclass(frozen=True)
class Tick:
    """Time passed with nothing else happening (the shell's wait for the next event timed out)."""


Event = Union[LocalExit, GotSignal, PartStopped, Started, SetupFailed, Tick, PeerDone, PeerFailed, PeerLost, Verdict]


# Actions: what the shell does ------------------------------------------------------------------------


@dataclass(frozen=True)
class Forward:
    """Pass a signal to this host's part of the job (``HostAgent.signal_job``)."""

    signum: int


@dataclass(frozen=True)
class Interrupt:
    """Abandon setup at once: a stopping signal arrived before the job started."""

    signum: int


@dataclass(frozen=True)
class Announce:
    """First host: tell every host the job's verdict."""

    verdict: Verdict


@dataclass(frozen=True)
class Report:
    """Other hosts: tell the first host this host failed, and when."""

    reason: str
    exit_code: int
    at: float | None


@dataclass(frozen=True)
class ReportDone:
    """Other hosts: tell the first host this host's part ended well."""

    exit_code: int = 0


@dataclass(frozen=True)
class Finish:
    """This host is done: ``outcome`` is its verdict."""

    outcome: Outcome


Action = Union[Forward, Interrupt, Announce, Report, ReportDone, Finish]


# State ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    outcome: Outcome
    at: float | None  # wall clock where it happened; None: not known


@dataclass(frozen=True)
class AgentState:
    """One host's view of the job.  Build with ``first_host`` or ``other_host``."""

    host: str
    is_master: bool
    workers: frozenset[str] = frozenset()  # first host: every other host
    wait_for_peers: bool = False  # first host: on its own success, wait for every host's own success?
    phase: str = SETUP
    primaries: frozenset[str] = frozenset()
    finished: frozenset[str] = frozenset()  # primaries that ended well
    done: frozenset[str] = frozenset()  # first host: hosts that reported their part done
    pending_signals: tuple[int, ...] = ()  # signals to pass on once the job starts
    stop_signal: int | None = None  # a stopping signal this host received: the job did not complete
    failures: tuple[Failure, ...] = ()  # in arrival order; on other hosts, at most one: this host's own
    succeeded: bool = False  # first host: its own part succeeded, waiting for the others (wait_for_peers)
    deadline: float | None = None  # monotonic; a Tick at or after it decides something
    outcome: Outcome | None = None  # set once ENDED


def first_host(host: str, workers, wait_for_peers: bool = False) -> AgentState:
    return AgentState(host, True, frozenset(workers), wait_for_peers)


def other_host(host: str) -> AgentState:
    return AgentState(host, False)


def root_cause(failures: tuple[Failure, ...]) -> Failure:
    """The earliest failure by the time it happened; unknown times last; ties by arrival."""
    return min(failures, key=lambda f: (f.at is None, f.at or 0.0))


def step(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if state.phase == ENDED:
        return state, ()
    if isinstance(event, GotSignal):
        return _signal(state, event.signum)
    if isinstance(event, Started):
        return (replace(state, phase=RUNNING, primaries=frozenset(event.primaries), pending_signals=()),
                tuple(Forward(s) for s in state.pending_signals))
    if isinstance(event, SetupFailed):
        return _setup_failed(state, event)
    if state.is_master:
        return _first_host(state, event, now)
    return _other_host(state, event, now)


def _signal(state: AgentState, signum: int) -> tuple[AgentState, tuple[Action, ...]]:
    stopping = signum in STOPPING_SIGNALS
    if state.phase == SETUP:
        if stopping:
            return replace(state, stop_signal=state.stop_signal or signum), (Interrupt(signum),)
        return replace(state, pending_signals=(*state.pending_signals, signum)), ()
    if stopping and state.stop_signal is None:
        state = replace(state, stop_signal=signum)
    return state, (Forward(signum),)


def _setup_failed(state: AgentState, event: SetupFailed) -> tuple[AgentState, tuple[Action, ...]]:
    outcome = event.outcome
    ended = replace(state, phase=ENDED, outcome=outcome, deadline=None)
    if state.is_master:
        return ended, (Announce(Verdict(outcome.exit_code, outcome.reason, state.host)), Finish(outcome))
    return ended, (Report(outcome.reason or "", outcome.exit_code, event.at), Finish(outcome))


# The first host ------------------------------------------------------------------------------------


def _first_host(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if isinstance(event, Tick):
        if state.deadline is None or now < state.deadline:
            return state, ()
        if state.failures:
            return _announce(state, root_cause(state.failures).outcome)
        missing = ", ".join(sorted(state.workers - state.done))
        return _announce(state, Outcome(EXIT_CLUSTER_ERROR, f"{state.host}: the job succeeded here but {missing} "
                                                            f"did not finish within {PEER_FINISH_TIMEOUT_S:g} s"))
    if isinstance(event, LocalExit) and state.stop_signal is None and event.status.ok and event.name in state.primaries:
        state = replace(state, finished=state.finished | {event.name})
        if state.failures or not state.primaries <= state.finished:
            return state, ()
        if state.wait_for_peers and not state.workers <= state.done:
            return replace(state, succeeded=True, deadline=now + PEER_FINISH_TIMEOUT_S), ()
        return _announce(state, Outcome(0))
    if isinstance(event, PeerDone) and event.exit_code == 0:
        state = replace(state, done=state.done | {event.host})
        if state.succeeded and not state.failures and state.workers <= state.done:
            return _announce(state, Outcome(0))
        return state, ()
    if isinstance(event, PeerDone):
        state = replace(state, done=state.done | {event.host})
    if isinstance(event, PeerLost) and event.host in state.done:
        return state, ()  # a host that finished its part may leave
    failure = _failure(state, event)
    if failure is None:
        return state, ()
    deadline = state.deadline if state.failures else now + FAILURE_WINDOW_S
    return replace(state, failures=(*state.failures, failure), deadline=deadline), ()


def _announce(state: AgentState, outcome: Outcome) -> tuple[AgentState, tuple[Action, ...]]:
    verdict = Verdict(outcome.exit_code, outcome.reason, state.host)
    return replace(state, phase=ENDED, outcome=outcome, deadline=None), (Announce(verdict), Finish(outcome))


# The other hosts -----------------------------------------------------------------------------------


def _other_host(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    own = state.failures[0].outcome if state.failures else None
    if isinstance(event, Verdict):
        outcome = Outcome(0) if event.exit_code == 0 else Outcome(
            event.exit_code, event.reason or f"the job failed with code {event.exit_code}")
        return _end(state, outcome)
    if isinstance(event, PeerLost):  # the first host is gone: this host's own failure, if any, is the best cause
        return _end(state, own or Outcome(EXIT_CLUSTER_ERROR, f"{state.host}: {event.reason}"))
    if isinstance(event, Tick):
        if own is not None and state.deadline is not None and now >= state.deadline:
            return _end(state, own)  # the first host never answered this host's report
        return state, ()
    if isinstance(event, LocalExit) and state.stop_signal is None and event.status.ok and event.name in state.primaries:
        if own is not None:
            return state, ()
        state = replace(state, finished=state.finished | {event.name})
        return state, (ReportDone(0),) if state.primaries <= state.finished else ()
    failure = _failure(state, event)
    if failure is None or own is not None:
        return state, ()
    report = Report(failure.outcome.reason or "", failure.outcome.exit_code, failure.at)
    return replace(state, failures=(failure,), deadline=now + REPORT_WAIT_S), (report,)


def _end(state: AgentState, outcome: Outcome) -> tuple[AgentState, tuple[Action, ...]]:
    return replace(state, phase=ENDED, outcome=outcome, deadline=None), (Finish(outcome),)


# What failed ---------------------------------------------------------------------------------------


def _failure(state: AgentState, event: Event) -> Failure | None:
    """The failure an event stands for, if it is one."""
    if isinstance(event, PartStopped):
        return Failure(_stopped(state.host, event.signum), event.at)
    if isinstance(event, LocalExit):
        if state.stop_signal is not None:  # however the processes ended, the job was stopped
            return Failure(_stopped(state.host, state.stop_signal), event.at)
        if event.status.ok and event.name in state.primaries:
            return None
        return Failure(_local_failure(state.host, event), event.at)
    if isinstance(event, PeerFailed):
        reason = event.reason if event.reason.startswith(event.host) else f"{event.host}: {event.reason}"
        return Failure(Outcome(event.exit_code, reason), event.at)
    if isinstance(event, PeerDone) and event.exit_code != 0:
        return Failure(Outcome(event.exit_code, f"{event.host}: exited with code {event.exit_code}"), event.at)
    if isinstance(event, PeerLost):
        return Failure(Outcome(EXIT_CLUSTER_ERROR, f"{event.host}: left the job ({event.reason})"), event.at)
    return None


def _local_failure(host: str, event: LocalExit) -> Outcome:
    if event.status.ok:  # a helper process (not a primary) ended on its own
        return Outcome(EXIT_CLUSTER_ERROR, f"{host}: {event.name} ended before the job did")
    return event.failure or Outcome(event.status.exit_code, f"{host}: {event.name} {event.status.describe()}")


def _stopped(host: str, signum: int) -> Outcome:
    return Outcome(128 + signum, f"{host}: stopped by {signal.Signals(signum).name}")
