"""The lead's rules while an attempt runs: the verdict, the root-cause window, stalls, restarts.

Pure (``decisions.step`` dispatches here).  Attempts (docs/resilience.md): a
failure or a stall, with restarts left and no stopping signal anywhere, is one
more transition (RUNNING -> STOPPING -> BARRIER -> RUNNING), not a second code
path.  A stall is the lead's: no progress (an output line of any rank,
or a heartbeat; once a heartbeat came, heartbeats only) within the stall
timeout, or within the longer startup allowance before an attempt's first
progress.
"""

from __future__ import annotations

from training_toolkit.agent.events import (Action, AnnounceRestart, Event, GatherStacks, LocalExit, PartStopped, Phase,
                                           Progress, StacksGathered, StopPart, Tick)
from training_toolkit.agent.failures import FAILURE_WINDOW_S, Failure, root_cause, stopped
from training_toolkit.agent.state import PEER_FINISH_TIMEOUT_S, STACKS_WAIT_S, AgentState, active_workers, led
from training_toolkit.agent.verdicts import announce, counts_ok, failure_of, no_part, with_causes
from training_toolkit.cluster.events import PeerDone, PeerFailed, PeerLost, PeerProgress
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR, EXIT_STALLED
from training_toolkit.core.records import replace
from training_toolkit.job.report import Outcome


def waits_for_parts(state: AgentState) -> bool:
    """A stopped the lead: its verdict waits until every host's part has stopped, each rank with its grace.

    The stop is the agent's: whichever rank or host ends its part first, the others keep their
    grace period.  Each host reports its part once all of it has stopped (``PartStopped``), not
    when its first process ends.  A job of one seat whose script's own exit is the verdict has
    no part to wait for.
    """
    return state.is_lead and state.stop_signal is not None and state.stop_wait_s > 0 and not state.own_end_on_stop


def running(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    lead = state.lead
    assert lead is not None
    if isinstance(event, (Progress, PeerProgress)):
        return _progress(state, event.heartbeat, now), ()
    if isinstance(event, StacksGathered):
        return _stalled(state, event) if state.phase == Phase.GATHERING else (state, ())
    if isinstance(event, Tick):
        return _tick(state, now)
    if state.phase == Phase.GATHERING:
        return state, ()  # the stall is being named; what the ranks do meanwhile does not change it
    if isinstance(event, LocalExit) and counts_ok(state, event):
        state = replace(state, finished=state.finished | {event.name})
        if state.failures or not state.primaries <= state.finished:
            return state, ()
        if lead.wait_for_peers and not active_workers(state) <= lead.done:
            return replace(led(state, succeeded=True, stall_deadline=None), deadline=now + PEER_FINISH_TIMEOUT_S), ()
        return announce(state, Outcome(0))
    if isinstance(event, PeerDone) and event.exit_code == 0:
        state = led(state, done=lead.done | {event.host})
        if lead.succeeded and not state.failures and active_workers(state) <= state.lead.done:
            return announce(state, Outcome(0))
        return _all_parts_stopped(state)
    if isinstance(event, PeerDone):
        state = led(state, done=lead.done | {event.host})
    if isinstance(event, PeerLost) and event.host in state.lead.done:
        return state, ()  # a host that finished its part may leave
    if isinstance(event, (PeerLost, PeerFailed)) and event.host not in active_workers(state):
        # a spare has no part: its loss or its failure (a host that came back and gave up waiting for a
        # restart) is no failure of the attempt; a lost one is not called at the next restart
        return state, no_part(state, event)
    failure = failure_of(state, event)
    if failure is None:
        return state, ()
    if waits_for_parts(state):  # the deadline is the stop's (set with the signal)
        host = event.host if isinstance(event, (PeerFailed, PeerLost)) else state.host
        part = isinstance(event, (PeerFailed, PeerLost, PartStopped))
        state = replace(led(state, stopped_hosts=lead.stopped_hosts | {host} if part else lead.stopped_hosts),
                        failures=(*state.failures, failure))
        return _all_parts_stopped(state)
    # the window is for followers' reports of earlier failures; a job of one host has none to wait for
    deadline = state.deadline if state.failures else now + (FAILURE_WINDOW_S if lead.workers else 0.0)
    return replace(state, failures=(*state.failures, failure), deadline=deadline), ()


def _all_parts_stopped(state: AgentState) -> tuple[AgentState, tuple[Action, ...]]:
    """A stopped lead concludes once every host's part has stopped (or reported done): no need to wait more."""
    if (waits_for_parts(state) and state.failures
            and active_workers(state) | {state.host} <= state.lead.stopped_hosts | state.lead.done):
        return conclude(state, state.failures)
    return state, ()


def _tick(state: AgentState, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    lead = state.lead
    assert lead is not None
    if state.deadline is not None and now >= state.deadline:
        if state.phase == Phase.GATHERING:
            return _stalled(state, StacksGathered((), ("every host: no stacks within the wait",)))
        if state.failures:
            return conclude(state, state.failures)
        if waits_for_parts(state):  # no part said it stopped in time: the job was stopped all the same
            assert state.stop_signal is not None
            return conclude(state, (Failure(stopped(state.host, state.stop_signal), None, stopped=True),))
        missing = ", ".join(sorted(active_workers(state) - lead.done))
        return announce(state, Outcome(EXIT_CLUSTER_ERROR, f"{state.host}: the job succeeded here but {missing} "
                                                           f"did not finish within {PEER_FINISH_TIMEOUT_S:g} s"))
    if (state.phase == Phase.RUNNING and not state.failures and lead.stall_deadline is not None
            and now >= lead.stall_deadline):
        return replace(led(state, stall_deadline=None), phase=Phase.GATHERING, deadline=now + STACKS_WAIT_S), \
            (GatherStacks(),)
    return state, ()


def _progress(state: AgentState, heartbeat: bool, now: float) -> AgentState:
    lead = state.lead
    assert lead is not None
    if lead.watch is None or state.phase != Phase.RUNNING or lead.stall_deadline is None:
        return state
    if lead.heartbeats and not heartbeat:
        return state  # heartbeats are the precise signal: once one came, output no longer counts
    return led(state, stall_deadline=now + lead.watch.stall_s, heartbeats=lead.heartbeats or heartbeat)


def _stalled(state: AgentState, event: StacksGathered) -> tuple[AgentState, tuple[Action, ...]]:
    from training_toolkit.stalls import stackreport  # only a stalled job needs it: not on the launch path

    lead = state.lead
    assert lead is not None and lead.watch is not None
    what = "heartbeat" if lead.heartbeats else "output line or heartbeat"
    summary = stackreport.summary(event.stacks) if event.stacks else "no stacks"
    missing = f"; no stacks from {', '.join(event.missing)}" if event.missing else ""
    reason = (f"{state.host}: the job stalled: no {what} from any rank for {lead.watch.stall_s:g} s; "
              f"stacks: {summary}{missing}")
    details = tuple(stackreport.details(event.stacks)) if event.stacks else ()
    outcome = Outcome(EXIT_STALLED, reason[:900], details=details)
    return conclude(replace(state, phase=Phase.RUNNING), (Failure(outcome, None),))


def conclude(state: AgentState, failures: tuple[Failure, ...]) -> tuple[AgentState, tuple[Action, ...]]:
    """The attempt failed: restart the job if restarts are left and nothing was a stop; else the verdict."""
    root = root_cause(failures)
    cause = root.outcome
    restartable = state.stop_signal is None and not any(f.stopped for f in failures)
    if restartable and state.attempt - state.first_attempt < state.max_restarts:
        reason = cause.reason or f"exit code {cause.exit_code}"
        assert state.lead is not None
        state = replace(led(state, stall_deadline=None), phase=Phase.STOPPING, causes=(*state.causes, reason),
                        cause_hosts=(*state.cause_hosts, root.host), failures=(), deadline=None)
        return state, (AnnounceRestart(state.attempt + 1, reason, root.host), StopPart(state.attempt))
    return announce(state, with_causes(state, cause))
