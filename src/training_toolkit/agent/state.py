"""What one host knows of the job, for the pure step (``decisions``): its state, built once per ``train``.

``now`` in every rule is the shell's monotonic clock: deadlines here are on it,
and a ``Tick`` tells the step that time has passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from training_toolkit.agent.events import Phase
from training_toolkit.agent.failures import Failure
from training_toolkit.records import record
from training_toolkit.report import Outcome

if TYPE_CHECKING:
    from training_toolkit.agent.barrier import Barrier, Roll

REPORT_WAIT_S = 5.0  # other hosts: after reporting a failure, how long to wait for the verdict before ending alone
PEER_FINISH_TIMEOUT_S = 600.0  # first host: after its own success, how long the others may take (wait_for_peers)

STOP_MARGIN_S = 3.0  # after the grace period: a host's SIGKILL to what is left (1 s at most) and its report

STACKS_WAIT_S = 6.0  # first host: how long gathering the stacks may take before the stall is named without them

SETUP, RUNNING, ENDED = Phase.SETUP, Phase.RUNNING, Phase.ENDED


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
    roll: Roll | None = None  # first host: what the channel said of every other host (None: nothing yet)
    barrier: Barrier | None = None  # first host: the barrier it runs now (SETUP or BARRIER), None otherwise
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


def channel_attempt(state: AgentState) -> int:
    """The attempt the first host's channel is at: the next one as soon as a restart is called (STOPPING)."""
    return state.attempt + 1 if state.phase == Phase.STOPPING else state.attempt
