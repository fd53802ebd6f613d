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

Attempts (docs/resilience.md): a failure or a stall, with restarts left and no
stopping signal anywhere, is one more transition (RUNNING -> STOPPING ->
BARRIER -> RUNNING, ``agent_events.Phase``), not a second code path.  A stall
is the first host's: no progress (an output line of any rank, or a heartbeat;
once a heartbeat came, heartbeats only) within the stall timeout, or within the
longer startup allowance before an attempt's first progress.
"""

from __future__ import annotations

import signal

from training_toolkit.records import record, replace

from training_toolkit.agent_events import (Action, Announce, AnnounceRestart, Event, Finish, Forward, GatherStacks,
                                           GotSignal, Interrupt, Joined, LocalExit, PartEnded, PartStopped, Phase, Progress,
                                           Rejoin, Report, ReportDone, Say, SendStacks, SetupFailed, ShareProgress,
                                           StacksGathered, Started, StopPart, Tick)
from training_toolkit.cluster.events import (FAILURE_WINDOW_S, PeerDone, PeerFailed, PeerLost, PeerProgress,
                                             RestartCalled, StacksWanted, Verdict, earliest)
from training_toolkit.errors import EXIT_CLUSTER_ERROR, EXIT_STALLED
from training_toolkit.process import STOPPING_SIGNALS
from training_toolkit.report import Outcome

REPORT_WAIT_S = 5.0  # other hosts: after reporting a failure, how long to wait for the verdict before ending alone
PEER_FINISH_TIMEOUT_S = 600.0  # first host: after its own success, how long the others may take (wait_for_peers)

STOP_MARGIN_S = 3.0  # after the grace period: a host's SIGKILL to what is left (1 s at most) and its report

STACKS_WAIT_S = 6.0  # first host: how long gathering the stacks may take before the stall is named without them

# A process that ended by a stopping signal before this host heard one: how long it waits for the host's own
# signal.  Slurm (scancel, --time), a terminal's ^C and local's stops signal every process of the job at once, and a
# handler that exits at once can end before train's own handler has run (seen under Slurm at a load of 25)
STOP_HEARD_S = 2.0

SETUP, RUNNING, ENDED = Phase.SETUP, Phase.RUNNING, Phase.ENDED


# State ---------------------------------------------------------------------------------------------


@record
class Failure:
    outcome: Outcome
    at: float | None  # wall clock where it happened; None: not known
    stopped: bool = False  # caused by a stopping signal: the job is stopped, never restarted
    host: str | None = None  # the host whose own processes failed (None: a stall, a host's loss, a stop)


@record
class Watch:
    """What counts as a stall: no progress for ``stall_s`` (``startup_s`` before an attempt's first progress)."""

    stall_s: float
    startup_s: float = 0.0


@record
class AgentState:
    """One host's view of the job.  Build with ``first_host`` or ``other_host``."""

    host: str
    is_master: bool
    workers: frozenset[str] = frozenset()  # first host: every other host
    wait_for_peers: bool = False  # first host: on its own success, wait for every host's own success?
    phase: Phase = Phase.SETUP
    primaries: frozenset[str] = frozenset()
    finished: frozenset[str] = frozenset()  # primaries that ended well
    done: frozenset[str] = frozenset()  # first host: hosts that reported their part done
    pending_signals: tuple[int, ...] = ()  # signals to pass on once the job starts
    stop_signal: int | None = None  # a stopping signal this host received: the job did not complete
    failures: tuple[Failure, ...] = ()  # in arrival order; on other hosts, at most one: this host's own
    succeeded: bool = False  # first host: its own part succeeded, waiting for the others (wait_for_peers)
    deadline: float | None = None  # monotonic; a Tick at or after it decides something
    outcome: Outcome | None = None  # set once ENDED
    attempt: int = 0
    max_restarts: int = 0  # restarts this job makes itself, from ``first_attempt`` on
    first_attempt: int = 0  # where the platform started the job (JobSet's restart-attempt): its restarts are its own
    causes: tuple[str, ...] = ()  # every earlier attempt's cause, in order
    cause_hosts: tuple[str | None, ...] = ()  # first host: whose own processes caused each (``roster.to_retire``)
    watch: Watch | None = None  # first host: stalls are watched for
    stall_deadline: float | None = None  # monotonic: no progress by then is a stall
    heartbeats: bool = False  # a heartbeat came this attempt: from now on only heartbeats are progress
    own_end_on_stop: bool = False  # a job of one seat: a stopped script's own exit is the verdict (the reference's)
    # stopped by a signal: how long the first host waits for every host's part to stop (the grace period and a
    # margin), and an other host for the verdict after its report; 0: the first report is as good as all
    stop_wait_s: float = 0.0
    stopped_hosts: frozenset[str] = frozenset()  # first host, during a stop: hosts whose part has stopped, itself too
    seated: frozenset[str] | None = None  # first host: the other hosts active this attempt (None: every worker);
    #                                       the rest are spares: no part, their loss no failure
    held: tuple = ()  # LocalExits by a stopping signal before this host had one (STOP_HEARD_S), in arrival order
    held_until: float | None = None  # monotonic: then they are judged as they are


def first_host(host: str, workers, wait_for_peers: bool = False, max_restarts: int = 0,
               watch: Watch | None = None, own_end_on_stop: bool = False, first_attempt: int = 0,
               stop_wait_s: float = 0.0) -> AgentState:
    return AgentState(host, True, frozenset(workers), wait_for_peers, max_restarts=max_restarts, watch=watch,
                      own_end_on_stop=own_end_on_stop, attempt=first_attempt, first_attempt=first_attempt,
                      stop_wait_s=stop_wait_s)


def other_host(host: str, max_restarts: int = 0, first_attempt: int = 0, stop_wait_s: float = 0.0) -> AgentState:
    return AgentState(host, False, max_restarts=max_restarts, attempt=first_attempt, first_attempt=first_attempt,
                      stop_wait_s=stop_wait_s)


def stop_wait(grace_s: float) -> float:
    """How long a stopped job's first host waits for every host's part: the grace, the kill after it, the report."""
    return grace_s + STOP_MARGIN_S


def next_deadline(state: AgentState) -> float | None:
    """When the shell must wake the step with a Tick if nothing else happens."""
    times = [t for t in (state.deadline, state.stall_deadline, state.held_until) if t is not None]
    return min(times) if times else None


def active_workers(state: AgentState) -> frozenset[str]:
    """The other hosts with a part in this attempt: the seated ones, else every worker."""
    return state.workers if state.seated is None else state.seated


def root_cause(failures: tuple[Failure, ...]) -> Failure:
    """The earliest failure by the time it happened; unknown times last; ties by arrival (``events.earliest``)."""
    return earliest(failures, lambda f: f.at)


def step(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if state.phase == Phase.ENDED:
        return state, ()
    if _stale(state, event):
        return state, ()
    if isinstance(event, LocalExit) and _ended_by_a_stop(state, event):
        return replace(state, held=(*state.held, event), held_until=state.held_until or now + STOP_HEARD_S), ()
    if state.held and (isinstance(event, GotSignal) and event.signum in STOPPING_SIGNALS
                       or isinstance(event, Tick) and state.held_until is not None and now >= state.held_until):
        return _release(state, event, now)
    return _step(state, event, now)


def _ended_by_a_stop(state: AgentState, event: LocalExit) -> bool:
    """A process of the running attempt died of a stopping signal, or exited 128 + one, and this host has none yet."""
    code = event.status.exit_code
    return (state.phase == Phase.RUNNING and state.stop_signal is None
            and code - 128 in STOPPING_SIGNALS and not event.status.killed_by_us)


def _release(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    """The stop came (the held exits are part of it) or the wait is over (they are judged as they are)."""
    held, state = state.held, replace(state, held=(), held_until=None)
    actions: tuple[Action, ...] = ()
    if isinstance(event, GotSignal):
        state, actions = _step(state, event, now)
    for exit_ in held:
        state, more = _step(state, exit_, now)
        actions += more
    if isinstance(event, Tick):
        state, more = _step(state, event, now)
        actions += more
    return state, actions


def _step(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if state.phase == Phase.ENDED:
        return state, ()
    if isinstance(event, GotSignal):
        return _signal(state, event.signum, now)
    if isinstance(event, Joined):
        return _joined(state, event), ()
    if isinstance(event, Started):
        return _started(state, event, now)
    if isinstance(event, SetupFailed):
        return _setup_failed(state, event)
    if isinstance(event, StacksWanted):
        return state, (SendStacks(),)
    if state.phase == Phase.STOPPING:
        return _stopping(state, event)
    if state.is_master:
        return _first_host(state, event, now)
    return _other_host(state, event, now)


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
        if _waits_for_parts(state) and state.phase == Phase.RUNNING:
            # the verdict waits for every host's part to stop (or this long): a host that heard it would end
            # its ranks still saving
            state = replace(state, deadline=now + state.stop_wait_s)
    return state, (Forward(signum),)


def _waits_for_parts(state: AgentState) -> bool:
    """A stopped first host: its verdict waits until every host's part has stopped, each rank with its grace.

    The stop is the agent's: whichever rank or host ends its part first, the others keep their
    grace period.  Each host reports its part once all of it has stopped (``PartStopped``), not
    when its first process ends.  A job of one seat whose script's own exit is the verdict has
    no part to wait for.
    """
    return state.is_master and state.stop_signal is not None and state.stop_wait_s > 0 and not state.own_end_on_stop


def attempt_to_join(job_attempt: int, started: bool) -> int:
    """The attempt a joining host takes part in: the job's, if its processes have not started yet, else the next.

    A host that joins a running attempt is one whose ``train`` restarted (a container restarted in
    its pod): its loss was that attempt's failure, so the restart it caused, if any is left, is its own.
    """
    return job_attempt + 1 if started else job_attempt


def _joined(state: AgentState, event: Joined) -> AgentState:
    if state.is_master or state.phase != Phase.SETUP:
        return state  # the first host's welcome is its own; a host joins once
    return replace(state, attempt=attempt_to_join(event.job_attempt, event.started))


def _started(state: AgentState, event: Started, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    """An attempt's processes run: its own bookkeeping starts afresh, the stall clock with the startup allowance."""
    watch = state.watch
    pending = state.pending_signals
    seated = state.seated if event.active is None or not state.is_master else \
        frozenset(event.active) - {state.host}
    state = replace(state, phase=Phase.RUNNING, primaries=frozenset(event.primaries), pending_signals=(), seated=seated,
                    finished=frozenset(), done=frozenset(), failures=(), succeeded=False, deadline=None, held=(),
                    held_until=None,
                    stall_deadline=now + max(watch.stall_s, watch.startup_s) if watch else None, heartbeats=False)
    return state, tuple(Forward(s) for s in pending)


def _setup_failed(state: AgentState, event: SetupFailed) -> tuple[AgentState, tuple[Action, ...]]:
    outcome = _with_causes(state, event.outcome)  # this host's verdict; its report to the first host is bare
    ended = replace(state, phase=Phase.ENDED, outcome=outcome, deadline=None, stall_deadline=None)
    if state.is_master:
        return ended, (Announce(Verdict(outcome.exit_code, outcome.reason, state.host)), Finish(outcome))
    bare = event.outcome
    return ended, (Report(bare.reason or "", bare.exit_code, event.at, state.attempt), Finish(outcome))


def _stopping(state: AgentState, event: Event) -> tuple[AgentState, tuple[Action, ...]]:
    """This host's part is being stopped for a restart: only its end, the verdict or a lost first host matter."""
    if isinstance(event, PartEnded):
        if state.stop_signal is not None:  # stopped meanwhile: the platform's stop is the end
            outcome = _stopped(state.host, state.stop_signal)
            if state.is_master:
                return _announce(state, outcome)
            return _end(state, outcome, Report(outcome.reason or "", outcome.exit_code, None, state.attempt, True))
        return (replace(state, phase=Phase.BARRIER, attempt=state.attempt + 1),
                (Rejoin(state.attempt + 1, state.causes[-1] if state.causes else ""),))
    if not state.is_master and isinstance(event, (Verdict, PeerLost)):
        return _other_host(state, event, 0.0)
    return state, ()


# The first host ------------------------------------------------------------------------------------


def _first_host(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if isinstance(event, (Progress, PeerProgress)):
        return _progress(state, event.heartbeat, now), ()
    if isinstance(event, StacksGathered):
        return _stalled(state, event) if state.phase == Phase.GATHERING else (state, ())
    if isinstance(event, Tick):
        return _first_host_tick(state, now)
    if state.phase == Phase.GATHERING:
        return state, ()  # the stall is being named; what the ranks do meanwhile does not change it
    if isinstance(event, LocalExit) and _counts_ok(state, event):
        state = replace(state, finished=state.finished | {event.name})
        if state.failures or not state.primaries <= state.finished:
            return state, ()
        if state.wait_for_peers and not active_workers(state) <= state.done:
            return replace(state, succeeded=True, deadline=now + PEER_FINISH_TIMEOUT_S, stall_deadline=None), ()
        return _announce(state, Outcome(0))
    if isinstance(event, PeerDone) and event.exit_code == 0:
        state = replace(state, done=state.done | {event.host})
        if state.succeeded and not state.failures and active_workers(state) <= state.done:
            return _announce(state, Outcome(0))
        return _all_parts_stopped(state)
    if isinstance(event, PeerDone):
        state = replace(state, done=state.done | {event.host})
    if isinstance(event, PeerLost) and event.host in state.done:
        return state, ()  # a host that finished its part may leave
    if isinstance(event, (PeerLost, PeerFailed)) and event.host not in active_workers(state):
        # a spare has no part: its loss or its failure (a host that came back and gave up waiting for a
        # restart) is no failure of the attempt; a lost one is not called at the next restart
        what = "was lost" if isinstance(event, PeerLost) else "failed"
        return state, (Say(f"{state.host}: {event.host}, with no part in this attempt, {what} ({event.reason}); "
                           "not a failure"),)
    failure = _failure(state, event)
    if failure is None:
        return state, ()
    if _waits_for_parts(state):  # the deadline is the stop's (set with the signal)
        host = event.host if isinstance(event, (PeerFailed, PeerLost)) else state.host
        part = isinstance(event, (PeerFailed, PeerLost, PartStopped))
        state = replace(state, failures=(*state.failures, failure),
                        stopped_hosts=state.stopped_hosts | {host} if part else state.stopped_hosts)
        return _all_parts_stopped(state)
    # the window is for other hosts' reports of earlier failures; a job of one host has none to wait for
    deadline = state.deadline if state.failures else now + (FAILURE_WINDOW_S if state.workers else 0.0)
    return replace(state, failures=(*state.failures, failure), deadline=deadline), ()


def _all_parts_stopped(state: AgentState) -> tuple[AgentState, tuple[Action, ...]]:
    """A stopped first host concludes once every host's part has stopped (or reported done): no need to wait more."""
    if (_waits_for_parts(state) and state.failures
            and active_workers(state) | {state.host} <= state.stopped_hosts | state.done):
        return _conclude(state, state.failures)
    return state, ()


def _first_host_tick(state: AgentState, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    if state.deadline is not None and now >= state.deadline:
        if state.phase == Phase.GATHERING:
            return _stalled(state, StacksGathered((), ("every host: no stacks within the wait",)))
        if state.failures:
            return _conclude(state, state.failures)
        if _waits_for_parts(state):  # no part said it stopped in time: the job was stopped all the same
            assert state.stop_signal is not None
            return _conclude(state, (Failure(_stopped(state.host, state.stop_signal), None, stopped=True),))
        missing = ", ".join(sorted(active_workers(state) - state.done))
        return _announce(state, Outcome(EXIT_CLUSTER_ERROR, f"{state.host}: the job succeeded here but {missing} "
                                                            f"did not finish within {PEER_FINISH_TIMEOUT_S:g} s"))
    if (state.phase == Phase.RUNNING and not state.failures and state.stall_deadline is not None
            and now >= state.stall_deadline):
        return replace(state, phase=Phase.GATHERING, stall_deadline=None, deadline=now + STACKS_WAIT_S), \
            (GatherStacks(),)
    return state, ()


def _progress(state: AgentState, heartbeat: bool, now: float) -> AgentState:
    if state.watch is None or state.phase != Phase.RUNNING or state.stall_deadline is None:
        return state
    if state.heartbeats and not heartbeat:
        return state  # heartbeats are the precise signal: once one came, output no longer counts
    return replace(state, stall_deadline=now + state.watch.stall_s, heartbeats=state.heartbeats or heartbeat)


def _stalled(state: AgentState, event: StacksGathered) -> tuple[AgentState, tuple[Action, ...]]:
    from training_toolkit import stackreport  # only a stalled job needs it: not on the launch path

    assert state.watch is not None
    what = "heartbeat" if state.heartbeats else "output line or heartbeat"
    summary = stackreport.summary(event.stacks) if event.stacks else "no stacks"
    missing = f"; no stacks from {', '.join(event.missing)}" if event.missing else ""
    reason = (f"{state.host}: the job stalled: no {what} from any rank for {state.watch.stall_s:g} s; "
              f"stacks: {summary}{missing}")
    details = tuple(stackreport.details(event.stacks)) if event.stacks else ()
    outcome = Outcome(EXIT_STALLED, reason[:900], details=details)
    return _conclude(replace(state, phase=Phase.RUNNING), (Failure(outcome, None),))


def _conclude(state: AgentState, failures: tuple[Failure, ...]) -> tuple[AgentState, tuple[Action, ...]]:
    """The attempt failed: restart the job if restarts are left and nothing was a stop; else the verdict."""
    root = root_cause(failures)
    cause = root.outcome
    restartable = state.stop_signal is None and not any(f.stopped for f in failures)
    if restartable and state.attempt - state.first_attempt < state.max_restarts:
        reason = cause.reason or f"exit code {cause.exit_code}"
        state = replace(state, phase=Phase.STOPPING, causes=(*state.causes, reason), failures=(), deadline=None,
                        stall_deadline=None, cause_hosts=(*state.cause_hosts, root.host))
        return state, (AnnounceRestart(state.attempt + 1, reason), StopPart(state.attempt))
    return _announce(state, _with_causes(state, cause))


def _with_causes(state: AgentState, outcome: Outcome) -> Outcome:
    """After restarts the verdict lists every attempt's cause."""
    if not state.causes or outcome.ok:
        return outcome
    earlier = tuple(f"attempt {state.first_attempt + i + 1}: {cause}" for i, cause in enumerate(state.causes))
    total = state.first_attempt + state.max_restarts + 1
    reason = f"{outcome.reason} (attempt {state.attempt + 1} of {total}; earlier: " \
             f"{'; '.join(earlier)})"
    return outcome._replace(reason=reason[:1000], details=(*outcome.details, "causes of earlier attempts:", *earlier))


def _announce(state: AgentState, outcome: Outcome) -> tuple[AgentState, tuple[Action, ...]]:
    verdict = Verdict(outcome.exit_code, outcome.reason, state.host)
    return (replace(state, phase=Phase.ENDED, outcome=outcome, deadline=None, stall_deadline=None),
            (Announce(verdict), Finish(outcome)))


# The other hosts -----------------------------------------------------------------------------------


def _other_host(state: AgentState, event: Event, now: float) -> tuple[AgentState, tuple[Action, ...]]:
    own = state.failures[0].outcome if state.failures else None
    if isinstance(event, Verdict):
        outcome = Outcome(0) if event.exit_code == 0 else Outcome(
            event.exit_code, event.reason or f"the job failed with code {event.exit_code}")
        return _end(state, outcome)
    if isinstance(event, PeerLost):  # the first host is gone: this host's own failure, if any, is the best cause
        return _end(state, own or Outcome(EXIT_CLUSTER_ERROR, f"{state.host}: {event.reason}"))
    if isinstance(event, RestartCalled):
        if event.attempt != state.attempt + 1 or state.phase != Phase.RUNNING or state.stop_signal is not None:
            return state, ()
        state = replace(state, phase=Phase.STOPPING, causes=(*state.causes, event.reason), failures=(), deadline=None)
        return state, (StopPart(state.attempt),)
    if isinstance(event, Progress):
        return state, (ShareProgress(event.heartbeat),) if state.phase == Phase.RUNNING else ()
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
    report = Report(failure.outcome.reason or "", failure.outcome.exit_code, failure.at, state.attempt, failure.stopped)
    # stopped: the first host's verdict waits for every host's part, so this host waits as long for it
    wait = max(REPORT_WAIT_S, state.stop_wait_s) if failure.stopped else REPORT_WAIT_S
    return replace(state, failures=(failure,), deadline=now + wait), (report,)


def _end(state: AgentState, outcome: Outcome, *before: Action) -> tuple[AgentState, tuple[Action, ...]]:
    return (replace(state, phase=Phase.ENDED, outcome=outcome, deadline=None, stall_deadline=None),
            (*before, Finish(outcome)))


# What failed ---------------------------------------------------------------------------------------


def _failure(state: AgentState, event: Event) -> Failure | None:
    """The failure an event stands for, if it is one."""
    if isinstance(event, PartStopped):
        if state.own_end_on_stop:
            return None  # the script's own exit is the verdict
        return Failure(_stopped(state.host, event.signum), event.at, stopped=True)
    if isinstance(event, LocalExit):
        if state.stop_signal is not None and not state.own_end_on_stop:  # however they ended, the job was stopped
            if state.stop_wait_s:
                return None  # one process of the part: the part's end (PartStopped) is what the job hears
            return Failure(_stopped(state.host, state.stop_signal), event.at, stopped=True)
        if event.status.ok and event.name in state.primaries:
            return None
        return Failure(_local_failure(state.host, event), event.at, stopped=state.stop_signal is not None,
                       host=state.host)
    if isinstance(event, PeerFailed):
        reason = event.reason if event.reason.startswith(event.host) else f"{event.host}: {event.reason}"
        return Failure(Outcome(event.exit_code, reason), event.at, stopped=event.stopped, host=event.host)
    if isinstance(event, PeerDone) and event.exit_code != 0:
        return Failure(Outcome(event.exit_code, f"{event.host}: exited with code {event.exit_code}"), event.at,
                       host=event.host)
    if isinstance(event, PeerLost):
        return Failure(Outcome(EXIT_CLUSTER_ERROR, f"{event.host}: left the job ({event.reason})"), event.at)
    return None


def _counts_ok(state: AgentState, event: LocalExit) -> bool:
    """A primary that ended well, and the job was not stopped (or its own end is the verdict)."""
    return (event.status.ok and event.name in state.primaries
            and (state.stop_signal is None or state.own_end_on_stop))


def _local_failure(host: str, event: LocalExit) -> Outcome:
    if event.status.ok:  # a helper process (not a primary) ended on its own
        return Outcome(EXIT_CLUSTER_ERROR, f"{host}: {event.name} ended before the job did")
    return event.failure or Outcome(event.status.exit_code, f"{host}: {event.name} {event.status.describe()}")


def _stopped(host: str, signum: int) -> Outcome:
    return Outcome(128 + signum, f"{host}: stopped by {signal.Signals(signum).name}")


__all__ = ["Action", "Announce", "AnnounceRestart", "Event", "Finish", "Forward", "GatherStacks", "GotSignal",
           "Interrupt", "Joined", "LocalExit", "PartEnded", "PartStopped", "Phase", "Progress", "Rejoin", "Report", "Say",
           "ReportDone", "SendStacks", "SetupFailed", "ShareProgress", "StacksGathered", "Started", "StopPart", "Tick",
           "PeerProgress", "RestartCalled", "StacksWanted", "FAILURE_WINDOW_S", "STOP_HEARD_S"]
