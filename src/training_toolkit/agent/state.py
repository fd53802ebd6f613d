"""What one host knows of the job, for the pure step (``decisions``): its state, built once per ``train``.

Split by role: every host's own part (``AgentState``), and what only the lead
keeps (``LeadState``: the followers' parts, the roll, the barrier, stalls).

``now`` in every rule is the shell's monotonic clock: deadlines here are on it,
and a ``Tick`` tells the step that time has passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from training_toolkit.agent.events import Phase
from training_toolkit.agent.failures import Failure
from training_toolkit.core.records import record, replace
from training_toolkit.job.report import Outcome

if TYPE_CHECKING:
    from training_toolkit.agent.barrier import Barrier, Roll

REPORT_WAIT_S = 5.0  # a follower: after reporting a failure, how long to wait for the verdict before ending alone
PEER_FINISH_TIMEOUT_S = 600.0  # the lead: after its own success, how long the others may take (wait_for_peers)

STOP_MARGIN_S = 3.0  # after the grace period: a host's SIGKILL to what is left (1 s at most) and its report

STACKS_WAIT_S = 6.0  # the lead: how long gathering the stacks may take before the stall is named without them

SETUP, RUNNING, ENDED = Phase.SETUP, Phase.RUNNING, Phase.ENDED


@record
class Watch:
    """What counts as a stall: no progress for ``stall_s`` (``startup_s`` before an attempt's first progress)."""

    stall_s: float
    startup_s: float = 0.0


@record
class LeadState:
    """What only the lead of an attempt keeps: the other hosts' parts, the channel's roll and the barrier, stalls.

    A follower has none (``AgentState.lead`` None): it reports to the lead and takes its verdict.
    """

    workers: frozenset[str] = frozenset()  # every other host of the job
    wait_for_peers: bool = False  # on its own success, wait for every host's own success?
    done: frozenset[str] = frozenset()  # hosts that reported their part done
    succeeded: bool = False  # its own part succeeded, waiting for the others (wait_for_peers)
    watch: Watch | None = None  # stalls are watched for
    stall_deadline: float | None = None  # monotonic: no progress by then is a stall
    heartbeats: bool = False  # a heartbeat came this attempt: from now on only heartbeats are progress
    stopped_hosts: frozenset[str] = frozenset()  # during a stop: hosts whose part has stopped, itself too
    seated: frozenset[str] | None = None  # the followers active this attempt (None: every worker);
    #                                       the rest are spares: no part, their loss no failure
    roll: Roll | None = None  # what the channel said of every other host (None: nothing yet)
    barrier: Barrier | None = None  # the barrier it runs now (SETUP or BARRIER), None otherwise


@record
class AgentState:
    """One host's view of the job, whatever its role.  Build with ``lead_state`` or ``follower_state``."""

    host: str
    lead: LeadState | None = None  # this host leads the attempt: what only the lead keeps (None: a follower)
    phase: Phase = Phase.SETUP
    primaries: frozenset[str] = frozenset()
    finished: frozenset[str] = frozenset()  # primaries that ended well
    pending_signals: tuple[int, ...] = ()  # signals to pass on once the job starts
    stop_signal: int | None = None  # a stopping signal this host received: the job did not complete
    failures: tuple[Failure, ...] = ()  # in arrival order; on a follower, at most one: this host's own
    deadline: float | None = None  # monotonic; a Tick at or after it decides something
    outcome: Outcome | None = None  # set once ENDED
    attempt: int = 0
    max_restarts: int = 0  # restarts this job makes itself, from ``first_attempt`` on
    first_attempt: int = 0  # where the platform started the job (JobSet's restart-attempt): its restarts are its own
    causes: tuple[str, ...] = ()  # every earlier attempt's cause, in order
    cause_hosts: tuple[str | None, ...] = ()  # whose own processes caused each (``roster.to_retire``): the lead's
    #   at its restarts, a follower's from the last go (``Attempt.causes``), so that a next lead has them
    own_end_on_stop: bool = False  # a job of one seat: a stopped script's own exit is the verdict (the reference's)
    # stopped by a signal: how long the lead waits for every host's part to stop (the grace period and a
    # margin), and a follower for the verdict after its report; 0: the first report is as good as all
    stop_wait_s: float = 0.0
    held: tuple = ()  # LocalExits by a stopping signal before this host had one (STOP_HEARD_S), in arrival order
    held_until: float | None = None  # monotonic: then they are judged as they are
    failover: bool = False  # a follower: the job goes on under a new lead if this one is lost (from ``Started``)
    lead_lost: str | None = None  # a follower stopping its part because its lead was lost: that lead

    @property
    def is_lead(self) -> bool:
        return self.lead is not None


def lead_state(host: str, workers, wait_for_peers: bool = False, max_restarts: int = 0,
               watch: Watch | None = None, own_end_on_stop: bool = False, first_attempt: int = 0,
               stop_wait_s: float = 0.0) -> AgentState:
    return AgentState(host, LeadState(frozenset(workers), wait_for_peers, watch=watch), max_restarts=max_restarts,
                      own_end_on_stop=own_end_on_stop, attempt=first_attempt, first_attempt=first_attempt,
                      stop_wait_s=stop_wait_s)


def follower_state(host: str, max_restarts: int = 0, first_attempt: int = 0, stop_wait_s: float = 0.0) -> AgentState:
    return AgentState(host, max_restarts=max_restarts, attempt=first_attempt, first_attempt=first_attempt,
                      stop_wait_s=stop_wait_s)


def promoted(state: AgentState, workers, wait_for_peers: bool = False, watch: Watch | None = None) -> AgentState:
    """A follower that takes the lead (its lead was lost, ``succession``): what the job has learnt travels in its
    state (the attempt, the platform's first attempt and so the restarts used, every earlier cause and whose ranks
    caused it); what only a lead keeps starts afresh."""
    return replace(state, lead=LeadState(frozenset(workers), wait_for_peers, watch=watch), failover=False,
                   lead_lost=None)


def led(state: AgentState, **changes) -> AgentState:
    """``state`` with the lead's own fields changed (``replace`` for ``AgentState.lead``)."""
    assert state.lead is not None
    return replace(state, lead=replace(state.lead, **changes))


def stop_wait(grace_s: float) -> float:
    """How long a stopped job's lead waits for every host's part: the grace, the kill after it, the report."""
    return grace_s + STOP_MARGIN_S


def next_deadline(state: AgentState) -> float | None:
    """When the shell must wake the step with a Tick if nothing else happens."""
    stall = state.lead.stall_deadline if state.lead else None
    times = [t for t in (state.deadline, stall, state.held_until) if t is not None]
    return min(times) if times else None


def active_workers(state: AgentState) -> frozenset[str]:
    """The lead: the followers with a part in this attempt: the seated ones, else every worker."""
    assert state.lead is not None
    return state.lead.workers if state.lead.seated is None else state.lead.seated


def channel_attempt(state: AgentState) -> int:
    """The attempt the lead's channel is at: the next one as soon as a restart is called (STOPPING)."""
    return state.attempt + 1 if state.phase == Phase.STOPPING else state.attempt
