"""A follower: it reports to the lead and takes its verdict, or finds the next lead when it is lost (pure; ``decisions.step`` dispatches here)."""

from __future__ import annotations

from training_toolkit.agent.events import (Action, Event, LocalExit, Phase, Progress, Report, ReportDone,
                                           ShareProgress, StopPart, Tick)
from training_toolkit.agent.state import REPORT_WAIT_S, AgentState
from training_toolkit.agent.verdicts import end, failure_of
from training_toolkit.cluster.events import PeerLost, RestartCalled, Verdict
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR
from training_toolkit.core.records import replace
from training_toolkit.job.report import Outcome


def _fails_over(state: AgentState) -> bool:
    """The lead's loss is one more restart, under a new lead: the job may (``Started.failover``: enough members for
    a majority without it), no stop came, and a restart is left (one called already counts: it is this one)."""
    if not state.failover or state.stop_signal is not None:
        return False
    if state.phase == Phase.STOPPING:
        return True
    return state.phase == Phase.RUNNING and state.attempt - state.first_attempt < state.max_restarts


def running(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    own = state.failures[0].outcome if state.failures else None
    if isinstance(event, Verdict):
        outcome = Outcome(0) if event.exit_code == 0 else Outcome(
            event.exit_code, event.reason or f"the job failed with code {event.exit_code}")
        return end(state, outcome)
    if isinstance(event, PeerLost):  # the lead is gone
        if state.lead_lost is not None:
            return state, ()  # already on the way to the next lead
        if _fails_over(state):  # the job goes on under the next lead: stop this host's part, then find it
            reason = f"{state.host}: {event.reason}"
            if state.phase == Phase.STOPPING:  # already stopping for a restart: it takes place under the next lead
                return replace(state, lead_lost=event.host), ()
            state = replace(state, phase=Phase.STOPPING, causes=(*state.causes, reason), failures=(), deadline=None,
                            lead_lost=event.host, cause_hosts=(*state.cause_hosts, None))  # no one host's ranks
            return state, (StopPart(state.attempt),)
        # this host's own failure, if any, is the best cause
        return end(state, own or Outcome(EXIT_CLUSTER_ERROR, f"{state.host}: {event.reason}"))
    if isinstance(event, RestartCalled):
        if event.attempt != state.attempt + 1 or state.phase != Phase.RUNNING or state.stop_signal is not None:
            return state, ()
        state = replace(state, phase=Phase.STOPPING, causes=(*state.causes, event.reason), failures=(), deadline=None,
                        cause_hosts=(*state.cause_hosts, event.cause))  # kept should this host lead later
        return state, (StopPart(state.attempt),)
    if isinstance(event, Progress):
        return state, (ShareProgress(event.heartbeat, event.checkpoint),) if state.phase == Phase.RUNNING else ()
    if isinstance(event, Tick):
        if own is not None and state.deadline is not None and now >= state.deadline:
            return end(state, own)  # the lead never answered this host's report
        return state, ()
    if isinstance(event, LocalExit) and state.stop_signal is None and event.status.ok and event.name in state.primaries:
        if own is not None:
            return state, ()
        state = replace(state, finished=state.finished | {event.name})
        return state, (ReportDone(0),) if state.primaries <= state.finished else ()
    failure = failure_of(state, event)
    if failure is None or own is not None:
        return state, ()
    report = Report(failure.outcome.reason or "", failure.outcome.exit_code, failure.at, state.attempt, failure.stopped)
    # stopped: the lead's verdict waits for every host's part, so this host waits as long for it
    wait = max(REPORT_WAIT_S, state.stop_wait_s) if failure.stopped else REPORT_WAIT_S
    return replace(state, failures=(failure,), deadline=now + wait), (report,)
