"""What an event means as a failure of this host's job, and the end of it: the verdict, with earlier attempts' causes.

Pure helpers of the step (``decisions``, ``lead_state``, ``follower_state``).
"""

from __future__ import annotations

from training_toolkit.agent.events import Action, Announce, EndLaunchers, Event, Finish, LocalExit, PartStopped, Phase, Say
from training_toolkit.agent.failures import Failure, local_failure, lost, peer_failure, stopped
from training_toolkit.agent.state import AgentState, active_workers, led
from training_toolkit.cluster.events import PeerDone, PeerFailed, PeerLost, Verdict
from training_toolkit.core.records import replace
from training_toolkit.job.report import Outcome


def failure_of(state: AgentState, event: Event) -> Failure | None:
    """The failure an event stands for, if it is one."""
    if isinstance(event, PartStopped):
        if state.own_end_on_stop:
            return None  # the script's own exit is the verdict
        return Failure(stopped(state.host, event.signum), event.at, stopped=True)
    if isinstance(event, LocalExit):
        if state.stop_signal is not None and not state.own_end_on_stop:  # however they ended, the job was stopped
            if state.stop_wait_s:
                return None  # one process of the part: the part's end (PartStopped) is what the job hears
            return Failure(stopped(state.host, state.stop_signal), event.at, stopped=True)
        if event.status.ok and event.name in state.primaries:
            return None
        return Failure(local_failure(state.host, event), event.at, stopped=state.stop_signal is not None,
                       host=event.host or state.host)
    if isinstance(event, PeerFailed):
        return peer_failure(event.host, event.reason, event.exit_code, event.at, event.stopped)
    if isinstance(event, PeerDone) and event.exit_code != 0:
        return Failure(Outcome(event.exit_code, f"{event.host}: exited with code {event.exit_code}"), event.at,
                       host=event.host)
    if isinstance(event, PeerLost):
        return lost(event.host, event.reason, event.at)
    return None


def no_part(state: AgentState, event: PeerLost | PeerFailed) -> tuple[Action, ...]:
    """A host with no part in the attempt (a spare, or a retired host) was lost or failed: said, never a failure."""
    what = "was lost" if isinstance(event, PeerLost) else "failed"
    return (Say(f"{state.host}: {event.host}, with no part in this attempt, {what} ({event.reason}); not a failure"),)


def spare_lost(state: AgentState, event: Event) -> tuple[Action, ...]:
    """First host, between attempts (stopping for a restart, or at a restart's barrier that waits for the hosts
    alive only): a lost host that had no part in the last attempt is said (``no_part``); its loss fails nothing.

    A spare's loss while an attempt runs is ``lead``'s; an active host's loss between attempts is told in the
    next attempt's line (``roster.attempt_line``: "algo-2 lost"); at barrier 0 any loss is a failure.
    """
    assert state.lead is not None
    between = state.phase == Phase.STOPPING or (state.lead.barrier is not None and state.lead.barrier.alive_only)
    if state.is_lead and between and isinstance(event, PeerLost) and event.host not in active_workers(state):
        return no_part(state, event)
    return ()


def counts_ok(state: AgentState, event: LocalExit) -> bool:
    """A primary that ended well, and the job was not stopped (or its own end is the verdict)."""
    return (event.status.ok and event.name in state.primaries
            and (state.stop_signal is None or state.own_end_on_stop))


def with_causes(state: AgentState, outcome: Outcome) -> Outcome:
    """After restarts the verdict lists every attempt's cause."""
    if not state.causes or outcome.ok:
        return outcome
    earlier = tuple(f"attempt {state.first_attempt + i + 1}: {cause}" for i, cause in enumerate(state.causes))
    total = state.first_attempt + state.max_restarts + 1
    reason = f"{outcome.reason} (attempt {state.attempt + 1} of {total}; earlier: " \
             f"{'; '.join(earlier)})"
    return outcome._replace(reason=reason[:1000], details=(*outcome.details, "causes of earlier attempts:", *earlier))


def ended(state: AgentState, outcome: Outcome) -> AgentState:
    if state.lead is not None:
        state = led(state, stall_deadline=None, barrier=None)
    return replace(state, phase=Phase.ENDED, outcome=outcome, deadline=None)


def announce(state: AgentState, outcome: Outcome) -> tuple[AgentState, tuple[Action, ...]]:
    """The lead: the verdict, told to every host; a stopped job's launchers ended first (``EndLaunchers``)."""
    stopped = state.stop_signal is not None
    first = (EndLaunchers(),) if stopped and not state.own_end_on_stop else ()
    verdict = Verdict(outcome.exit_code, outcome.reason, state.host)
    return ended(state, outcome), (*first, Announce(verdict, linger=not stopped), Finish(outcome))


def end(state: AgentState, outcome: Outcome, *before: Action) -> tuple[AgentState, tuple[Action, ...]]:
    """Other hosts: this host is done."""
    return ended(state, outcome), (*before, Finish(outcome))
