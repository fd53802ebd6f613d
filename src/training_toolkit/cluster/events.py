"""What the control channel tells the runner: events posted to its queue, and the verdict.

``at``: the wall clock (time.time()) when it happened, as the failed host says (a failure), or
when this host learnt of it; it orders failures (``agent.failures.root_cause``), it is not the event's identity.

The channel's server only posts these (joins, readiness, losses with their reason, failure reports): what they
mean for a barrier or a running job is decided by the agent (``agent.barrier``, ``agent.decisions``).
"""

from __future__ import annotations

import math

from training_toolkit.core.records import record

# A failure report's own time is believed within this much before its arrival (clocks differ; a report
# is sent within a second of the failure), and never after its arrival.
MAX_REPORT_AGE_S = 2.0


@record(uncompared=("at",))
class PeerFailed:
    host: str
    reason: str
    exit_code: int
    at: float | None = None
    attempt: int = 0  # the attempt the host was in: a report from an attempt already over is stale
    stopped: bool = False  # the host was stopped by a signal (the platform's stop): never a cause to restart


@record
class PeerJoined:
    """The lead: a host took its seat (welcomed); it is linked until a ``PeerLost``."""

    host: str


@record
class PeerReady:
    """The lead: a host said it is ready for ``attempt`` (its part prepared, waiting for the go)."""

    host: str
    attempt: int = 0


@record
class PeerProgress:
    """A host saw progress (an output line of a rank, or a heartbeat; ``checkpoint``: a checkpoint marked)."""

    host: str
    heartbeat: bool = False
    checkpoint: bool = False


@record
class MarkShared:
    """Other hosts: the lead says a checkpoint was marked on ``host`` (its own ranks', or another host's it heard of),
    so that every host's record has the job's marks, should the lead be lost (``record/cost.py``).  ``attempt``: the
    mark's; ``at``: when the lead told of it, by its clock (``reported_time``), so that a mark handled late (a follower
    waiting for a go handles it after) counts when it was made."""

    host: str
    attempt: int = 0
    at: float | None = None


@record
class RestartCalled:
    """Other hosts: the lead restarts the job; ``attempt`` is the new one, ``cause`` whose ranks failed (None: no one
    host's)."""

    attempt: int
    reason: str
    cause: str | None = None


@record
class StacksWanted:
    """Other hosts: the job stalled; the lead wants this host's ranks' stacks."""


@record(uncompared=("at",))
class PeerDone:
    host: str
    exit_code: int
    at: float | None = None


@record(uncompared=("at",))
class PeerLost:
    host: str
    reason: str
    at: float | None = None


@record(uncompared=("summary",))
class Verdict:
    """The job's end, as decided by the lead (its summary line is what it says, not what it is: uncompared)."""

    exit_code: int
    reason: str | None = None
    host: str | None = None
    summary: str | None = None  # the lead's summary line of the job's cost (``record.summary``), for every host's log


def reported_time(value: object, received: float) -> float:
    """When a reported failure happened: the report's own time, within ``MAX_REPORT_AGE_S`` before its arrival.

    A report without a usable time (another toolkit version) counts as happening when it arrived.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return received
    return min(received, max(float(value), received - MAX_REPORT_AGE_S))

