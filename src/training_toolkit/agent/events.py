"""What the agent's pure step reads (events) and returns (actions), and the phases it moves through.

Kept apart from the rules (``decisions``, ``barrier``, ``lead_state``) so that
each stays readable on its own; ``decisions`` re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Union

from training_toolkit.cluster.events import (MarkShared, PeerDone, PeerFailed, PeerJoined, PeerLost, PeerProgress,
                                             PeerReady, RestartCalled, StacksWanted, Verdict)
from training_toolkit.supervise.process import ExitStatus
from training_toolkit.core.records import record
from training_toolkit.job.report import Outcome

if TYPE_CHECKING:
    from training_toolkit.stalls.stackreport import RankStack


class Phase(str, Enum):
    """Where a host is in the job.  Transitions (``decisions.step``)::

        SETUP (join, prepare, barrier 0, start) --Started--> RUNNING
        SETUP or BARRIER, the lead: BarrierOpened --Release (every host ready)--> the shell starts the attempt;
                                                     --a failure, or the deadline on a Tick--> ENDED
        SETUP --Joined a job already past attempt 0's start (a host that rejoins)--> SETUP at the next attempt
        RUNNING --a failure, after the root-cause window--> ENDED, or STOPPING if restarts are left
        RUNNING --no progress within the stall timeout (the lead)--> GATHERING --stacks--> as a failure
        STOPPING --this host's part of the attempt ended (PartEnded)--> BARRIER (attempt n+1)
        RUNNING, a follower --its lead lost, the job may go on (Started.failover)--> STOPPING --PartEnded-->
            BARRIER (attempt n+1, under the next lead: ``FailOver``; this host may be it)
        BARRIER (barrier n+1, start) --Started--> RUNNING;  --SetupFailed--> ENDED
        any --a stopping signal--> ends the job (never a restart)

    SETUP and BARRIER are run by the shell in order; the lead's barrier is
    decided here on the channel's events and Ticks; a stopping signal ends them
    (``Interrupt``).
    """

    SETUP = "setup"
    RUNNING = "running"
    GATHERING = "gathering"
    STOPPING = "stopping"
    BARRIER = "barrier"
    ENDED = "ended"


# Events: what happened ------------------------------------------------------------------------------


@record
class LocalExit:
    """A local process ended; ``failure`` is the runner's description of a failed exit (None if it did not fail).

    ``host``: whose own processes failed, as the runner told it (MPI: the failing rank's host; None: this host).
    """

    name: str
    status: ExitStatus
    at: float | None = None  # wall clock when its end was seen
    failure: Outcome | None = None
    attempt: int = 0  # the attempt it was started for: an earlier attempt's exit is stale
    host: str | None = None


@record
class GotSignal:
    signum: int


@record
class PartStopped:
    """This host's part of the job was stopped by a signal, all of it ended.  ``at``: when the signal came (the stop
    happened then, however long its ranks took to save): the root cause of a job stopped on every host is the
    stop that came first, as the record says it, not the part that ended first."""

    signum: int
    at: float | None = None


@record
class Started:
    """Setup (or a restart's barrier) is over; ``primaries`` are the local processes whose ends end this host's part.

    ``active``: the attempt's active hosts (None: every host of the job); the others are spares, with no part.
    """

    primaries: tuple[str, ...]
    active: tuple[str, ...] | None = None
    failover: bool = False  # a follower: should the lead be lost, the job goes on under a new one (``succession``)


@record
class Joined:
    """This host took its seat; the lead's welcome said the job is at ``job_attempt``, started or not.

    A host whose ``train`` restarted (Kubernetes restarts a container in its pod) comes into a job
    that went on without it: its loss was a failure, so it takes part in the attempt that follows.
    """

    job_attempt: int = 0
    started: bool = False


@record
class SetupFailed:
    """Setup failed (join, prepare, barrier, start); ``outcome`` names the cause."""

    outcome: Outcome
    at: float | None = None


@record
class Tick:
    """Time passed with nothing else happening (the shell's wait for the next event timed out)."""


@record
class Progress:
    """This host saw progress: an output line of one of its ranks, or a heartbeat file touched."""

    heartbeat: bool = False
    attempt: int = 0  # of the processes that made it: an earlier attempt's last words are not progress
    checkpoint: bool = False  # a rank marked a checkpoint saved (its heartbeat directory's ``checkpoint`` file)


@record
class StacksGathered:
    """The lead: every rank's stack it could get, from every host that answered in time."""

    stacks: tuple[RankStack, ...]
    missing: tuple[str, ...] = ()  # hosts that did not answer


@record
class BarrierOpened:
    """The lead: the barrier of the current attempt begins; ``expected`` (every other host, in rank order) must be
    ready within ``deadline_s`` (``alive_only``: only the hosts still linked; a loss is then no failure;
    ``members``: a new lead's first barrier, passed at its deadline by a majority of them, and waiting until then for
    ``needed`` hosts, ``barrier.Barrier``)."""

    expected: tuple[str, ...]
    deadline_s: float
    alive_only: bool = False
    members: tuple[str, ...] = ()
    needed: int = 0


@record
class PartEnded:
    """This host's part of ``attempt`` is stopped (every local process gone), for a restart."""

    attempt: int


Event = Union[LocalExit, GotSignal, PartStopped, Started, Joined, SetupFailed, Tick, Progress, StacksGathered, PartEnded,
              BarrierOpened, PeerDone, PeerFailed, PeerJoined, PeerLost, PeerProgress, PeerReady, RestartCalled,
              StacksWanted, Verdict, MarkShared]


# Actions: what the shell does ------------------------------------------------------------------------


@record
class Forward:
    """Pass a signal to this host's part of the job (``HostAgent.signal_job``: ``Part.signal``, the same stop for every runner)."""

    signum: int


@record
class Interrupt:
    """Abandon setup at once: a stopping signal arrived before the job started."""

    signum: int


@record
class Announce:
    """The lead: tell every host the job's verdict.  ``linger``: hosts still on their way are waited for to hear it
    (the join deadline, at most ``membership.VERDICT_LINGER_S``); not after a stop of the lead's own: the platform
    stops the others too, and its kill, a grace period after its signal, would come before the wait ended."""

    verdict: Verdict
    linger: bool = True


@record
class EndLaunchers:
    """The lead of a stopped job, before it tells the verdict: every host's programs have stopped (or had their
    grace), so this host's launchers (mpirun) serve nothing now: ended at once, before the others hear the verdict
    and leave (mpirun, seeing their daemons go, would print Open MPI's block about daemons it could not reach)."""


@record
class Report:
    """Other hosts: tell the lead this host failed, and when."""

    reason: str
    exit_code: int
    at: float | None
    attempt: int = 0
    stopped: bool = False


@record
class ReportDone:
    """Other hosts: tell the lead this host's part ended well."""

    exit_code: int = 0


@record
class Finish:
    """This host is done: ``outcome`` is its verdict."""

    outcome: Outcome


@record
class ShareProgress:
    """Other hosts: tell the lead this host saw progress (``checkpoint``: a checkpoint marked)."""

    heartbeat: bool = False
    checkpoint: bool = False


@record
class ShareMark:
    """The lead: tell every other host a checkpoint was marked on ``host`` in ``attempt`` (``MarkShared``)."""

    host: str
    attempt: int


@record
class GatherStacks:
    """The lead: read this host's ranks' stacks and ask every host for theirs; then ``StacksGathered``."""


@record
class SendStacks:
    """Other hosts: read this host's ranks' stacks and send them to the lead."""


@record
class AnnounceRestart:
    """The lead: tell every host to stop its part and meet for ``attempt``; ``cause``: whose ranks failed (None: no
    one host's), which every host keeps for the retire rule should it lead later."""

    attempt: int
    reason: str
    cause: str | None = None


@record
class StopPart:
    """Stop this host's part of ``attempt`` (grace period, then kill); then ``PartEnded``."""

    attempt: int


@record
class FailOver:
    """A follower whose lead was lost, its part stopped: find the next lead (``succession``; maybe this host), meet
    at the barrier of ``attempt`` under it and start again; then ``Started`` or ``SetupFailed``."""

    attempt: int
    reason: str
    lost: str  # the lead that was lost


@record
class Rejoin:
    """Meet every host at the barrier of ``attempt`` and start again; then ``Started`` or ``SetupFailed``."""

    attempt: int
    reason: str


@record
class Release:
    """The lead: the barrier passed; choose the attempt's active hosts among ``ready`` and send every host the go.

    ``why``: why each host that was lost was lost (its last loss), for the roster's line.
    """

    ready: frozenset[str]
    why: Mapping[str, str]


@record
class Say:
    """Log one line (what happened that is no failure: a spare lost)."""

    line: str


Action = Union[Forward, Interrupt, EndLaunchers, Announce, Report, ReportDone, Finish, ShareProgress, ShareMark,
               GatherStacks, SendStacks, AnnounceRestart, StopPart, Rejoin, Release, Say]
