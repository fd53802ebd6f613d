"""The agent's decisions: a pure step over events, ``step(state, event, now) -> (state, actions)``.

What a local exit, a peer's report, a host's join, readiness or loss, a signal
or the passing of time means for this host, when the job is over and what every
host is told, decided without processes, sockets or clocks of their own, so
that every rule is a row in a table test (test/unit/test_decisions*.py,
test/unit/agent/test_barrier.py).  ``agent.loop.HostAgent`` is the shell: it turns
what happens into events, feeds them to ``step`` and carries out the actions.

This module dispatches and holds the rules every phase shares (signals, the
start of an attempt, a setup failure, a restart's stop); the rest is split by
what it decides: ``barrier`` (the lead's barrier), ``lead`` (the first
host's rules while an attempt runs: verdict, stalls, restarts), ``follow`` (the
followers'), ``verdicts``, and
``failures`` (what failed, and the one root-cause rule for all of them).  Time
enters as ``Tick`` events: a deadline is a decision on a Tick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from training_toolkit.agent.events import (Action, Announce, AnnounceRestart, BarrierOpened, EndLaunchers, Event, FailOver,
                                           Finish, Forward, GatherStacks, GotSignal, Interrupt, Joined, LocalExit, PartEnded,
                                           PartStopped, Phase, Progress, Rejoin, Release, Report, ReportDone, Say,
                                           SendStacks, SetupFailed, ShareMark, ShareProgress, StacksGathered, Started,
                                           StopPart, Tick)
from training_toolkit.agent.failures import FAILURE_WINDOW_S, Failure, root_cause, stopped
from training_toolkit.agent.state import (ENDED, PEER_FINISH_TIMEOUT_S, REPORT_WAIT_S, RUNNING, SETUP, STACKS_WAIT_S,
                                          STOP_MARGIN_S, AgentState, LeadState, Watch, active_workers, channel_attempt, led,
                                          lead_state, next_deadline, follower_state, promoted, stop_wait)
from training_toolkit.agent.verdicts import announce, end, ended, spare_lost, with_causes
from training_toolkit.cluster.events import (MarkShared, PeerDone, PeerFailed, PeerJoined, PeerLost, PeerProgress,
                                             PeerReady, RestartCalled, StacksWanted, Verdict)
from training_toolkit.supervise.process import STOPPING_SIGNALS
from training_toolkit.supervise.stopping import STOP_HEARD_S
from training_toolkit.core.records import replace

if TYPE_CHECKING:
    from training_toolkit.job.attempt import Attempt

CHANNEL = (PeerJoined, PeerReady, PeerLost, PeerFailed)  # what the lead's roll keeps, in every phase


def step(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    after, actions = _step(state, event, now)
    return after, (*actions, *_marks_shared(state, event))


def _marks_shared(state: AgentState, event: Event) -> tuple[Action, ...]:
    """The lead tells every other host each checkpoint marked, its own ranks' or a host's it heard of, in any phase (a
    save in a stop's grace is one): should the lead be lost, the next one's record counts the work since it."""
    if state.is_lead and state.phase != Phase.ENDED and isinstance(event, (Progress, PeerProgress)) and event.checkpoint:
        if isinstance(event, PeerProgress):
            return (ShareMark(event.host, state.attempt),)
        return (ShareMark(state.host, event.attempt),)
    return ()


def _step(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if state.phase == Phase.ENDED:
        return state, ()
    if state.is_lead and isinstance(event, CHANNEL):
        from training_toolkit.agent import barrier  # a job of one host has no channel: it never loads the barrier

        said = spare_lost(state, event)  # between attempts: a spare's loss, said (the roll keeps it as no failure)
        assert state.lead is not None
        state = led(state, roll=barrier.note(state.lead.roll or barrier.Roll(), event, now, channel_attempt(state)))
        if state.lead.barrier is not None:
            state, actions = _barrier(state, now)
            return state, (*said, *actions)
        if said or isinstance(event, (PeerJoined, PeerReady)):
            return state, said
    if _stale(state, event):
        return state, ()
    if isinstance(event, LocalExit) and _ended_by_a_stop(state, event):
        return replace(state, held=(*state.held, event), held_until=state.held_until or now + STOP_HEARD_S), ()
    if state.held and (isinstance(event, GotSignal) and event.signum in STOPPING_SIGNALS
                       or isinstance(event, Tick) and state.held_until is not None and now >= state.held_until):
        return _release(state, event, now)
    return _dispatch(state, event, now)


def _ended_by_a_stop(state: AgentState, event: LocalExit) -> bool:
    """A process of the running attempt died of a stopping signal, or exited 128 + one, and this host has none yet."""
    return (state.phase == Phase.RUNNING and state.stop_signal is None
            and event.status.exit_code - 128 in STOPPING_SIGNALS and not event.status.killed_by_us)


def _release(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    """The stop came (the held exits are part of it) or the wait is over (they are judged as they are)."""
    held, state = state.held, replace(state, held=(), held_until=None)
    actions: tuple[Action, ...] = ()
    if isinstance(event, GotSignal):
        state, actions = _dispatch(state, event, now)
    for exit_ in held:
        state, more = _dispatch(state, exit_, now)
        actions += more
    if isinstance(event, Tick):
        state, more = _dispatch(state, event, now)
        actions += more
    return state, actions


def _dispatch(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if state.phase == Phase.ENDED:
        return state, ()
    if isinstance(event, GotSignal):
        return _signal(state, event.signum, now)
    if isinstance(event, BarrierOpened):
        return _barrier_opened(state, event, now)
    if isinstance(event, Tick) and state.lead is not None and state.lead.barrier is not None:
        return _barrier(state, now)
    if isinstance(event, Joined):
        return _joined(state, event), ()
    if isinstance(event, Started):
        return _started(state, event, now)
    if isinstance(event, SetupFailed):
        return _setup_failed(state, event)
    if isinstance(event, StacksWanted):
        return state, (SendStacks(),)
    if isinstance(event, MarkShared):
        return state, ()  # the record's alone (``recording.observed``)
    if state.phase == Phase.STOPPING:
        return _stopping(state, event)
    if state.is_lead:
        from training_toolkit.agent import lead  # each host loads the rules of its role only
        return lead.running(state, event, now)
    from training_toolkit.agent import follow
    return follow.running(state, event, now)


def _stale(state: AgentState, event: Event) -> bool:
    """An event of an attempt already over (a process of it ending late, a report sent before the restart)."""
    if isinstance(event, (LocalExit, PeerFailed, Progress)):
        return event.attempt != state.attempt
    return isinstance(event, PartEnded) and event.attempt != state.attempt


def _signal(state: AgentState, signum: int, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    stopping = signum in STOPPING_SIGNALS
    if state.phase in (Phase.SETUP, Phase.BARRIER):
        if stopping:
            return replace(state, stop_signal=state.stop_signal or signum), (Interrupt(signum),)
        return replace(state, pending_signals=(*state.pending_signals, signum)), ()
    if stopping and state.stop_signal is None:
        state = replace(state, stop_signal=signum)
        from training_toolkit.agent.lead import waits_for_parts

        if waits_for_parts(state) and state.phase == Phase.RUNNING:
            # the verdict waits for every host's part to stop (or this long): a host that heard it would end
            # its ranks still saving
            state = replace(state, deadline=now + state.stop_wait_s)
    return state, (Forward(signum),)


def _barrier_opened(state: AgentState, event: BarrierOpened, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    """The lead: the barrier of this attempt begins (its deadline from now); failures of earlier ones are over."""
    from training_toolkit.agent import barrier

    opened = barrier.Barrier(state.attempt, tuple(event.expected), now + event.deadline_s, event.deadline_s,
                             event.alive_only, tuple(event.members), event.needed)
    assert state.lead is not None
    return _barrier(led(state, barrier=opened, roll=barrier.opened(state.lead.roll or barrier.Roll(), state.attempt)), now)


def _barrier(state: AgentState, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    from training_toolkit.agent import barrier

    lead = state.lead
    assert lead is not None and lead.barrier is not None and lead.roll is not None
    outcome = barrier.decide(state.host, lead.roll, lead.barrier, now)
    if isinstance(outcome, barrier.Waiting):
        return replace(state, deadline=outcome.until), ()
    if isinstance(outcome, barrier.Passed):
        return replace(led(state, barrier=None), deadline=None), (Release(outcome.ready, outcome.why),)
    return _setup_failed(state, SetupFailed(outcome.outcome))


def attempt_to_join(job_attempt: int, started: bool) -> int:
    """The attempt a joining host takes part in: the job's, if its processes have not started yet, else the next.

    A host that joins a running attempt is one whose ``train`` restarted (a container restarted in
    its pod): its loss was that attempt's failure, so the restart it caused, if any is left, is its own.
    """
    return job_attempt + 1 if started else job_attempt


def toward(state: AgentState, number: int) -> AgentState:
    """A host between attempts, on its way to attempt ``number`` (never back to an older one): the term of the next
    lead it tries after a lost one (``succession.term``), or the newer attempt of a lead it now follows."""
    return replace(state, attempt=number) if number > state.attempt else state


def take_seat(state: AgentState, attempt: Attempt) -> AgentState:
    """The attempt a host was seated in is its attempt from now on: a follower's is the one its lead's go started,
    newer than the one it waited for when the lead went on without it meanwhile (its reports, its processes' attempt
    and the restarts left all follow the job's count), and it keeps whose ranks caused each earlier failure as the
    go said (a next lead's retire rule counts them); the lead's is its own."""
    if state.is_lead:
        return state
    assert attempt.number >= state.attempt, (attempt.number, state.attempt)  # never an older go than it waited for
    return replace(state, attempt=attempt.number, cause_hosts=attempt.causes)


def _joined(state: AgentState, event: Joined) -> AgentState:
    if state.is_lead or state.phase != Phase.SETUP:
        return state  # the lead's welcome is its own; a host joins once
    return replace(state, attempt=attempt_to_join(event.job_attempt, event.started))


def _started(state: AgentState, event: Started, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    """An attempt's processes run: its own bookkeeping starts afresh, the stall clock with the startup allowance."""
    pending = state.pending_signals
    state = replace(state, phase=Phase.RUNNING, primaries=frozenset(event.primaries), pending_signals=(),
                    finished=frozenset(), failures=(), deadline=None, held=(), held_until=None,
                    failover=event.failover and state.lead is None, lead_lost=None)
    if state.lead is not None:
        watch = state.lead.watch
        seated = state.lead.seated if event.active is None else frozenset(event.active) - {state.host}
        state = led(state, seated=seated, done=frozenset(), succeeded=False, heartbeats=False,
                    stall_deadline=now + max(watch.stall_s, watch.startup_s) if watch else None)
    return state, tuple(Forward(s) for s in pending)


def _setup_failed(state: AgentState, event: SetupFailed) -> tuple[AgentState, tuple[Action, ...]]:
    outcome = with_causes(state, event.outcome)  # this host's verdict; its report to the lead is bare
    if state.is_lead:
        return announce(state, outcome)
    bare = event.outcome
    return ended(state, outcome), (Report(bare.reason or "", bare.exit_code, event.at, state.attempt), Finish(outcome))


def _stopping(state: AgentState, event: Event) -> tuple[AgentState, tuple[Action, ...]]:
    """This host's part is being stopped for a restart: only its end, the verdict or a lost lead matter."""
    if isinstance(event, PartEnded):
        if state.stop_signal is not None:  # stopped meanwhile: the platform's stop is the end
            outcome = stopped(state.host, state.stop_signal)
            if state.is_lead:
                return announce(state, outcome)
            return end(state, outcome, Report(outcome.reason or "", outcome.exit_code, None, state.attempt, True))
        reason = state.causes[-1] if state.causes else ""
        if state.lead_lost is not None:  # under the next lead: this host finds it (or is it)
            return (replace(state, phase=Phase.BARRIER, attempt=state.attempt + 1),
                    (FailOver(state.attempt + 1, reason, state.lead_lost),))
        return replace(state, phase=Phase.BARRIER, attempt=state.attempt + 1), (Rejoin(state.attempt + 1, reason),)
    if not state.is_lead and isinstance(event, (Verdict, PeerLost)):
        from training_toolkit.agent import follow

        return follow.running(state, event, 0.0)
    return state, ()


__all__ = ["Action", "AgentState", "Announce", "AnnounceRestart", "BarrierOpened", "ENDED", "EndLaunchers", "Event", "FAILURE_WINDOW_S", "FailOver",
           "Failure", "Finish", "Forward", "GatherStacks", "GotSignal", "Interrupt", "Joined", "LeadState", "LocalExit",
           "MarkShared", "PEER_FINISH_TIMEOUT_S", "PartEnded", "PartStopped", "PeerDone", "PeerJoined", "PeerProgress", "PeerReady",
           "Phase", "Progress", "REPORT_WAIT_S", "RUNNING", "Rejoin", "Release", "Report", "ReportDone",
           "RestartCalled", "SETUP", "STACKS_WAIT_S", "STOP_HEARD_S", "STOP_MARGIN_S", "Say", "SendStacks", "SetupFailed",
           "ShareMark", "ShareProgress", "StacksGathered", "StacksWanted", "Started", "StopPart", "Tick", "Verdict", "Watch",
           "active_workers", "attempt_to_join", "promoted", "lead_state", "next_deadline", "follower_state", "root_cause", "take_seat",
           "toward",
           "step",
           "stop_wait"]
