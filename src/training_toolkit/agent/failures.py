"""What failed, and which failure is the root cause: the one rule, for a barrier and a running job alike.

The root cause is the earliest failure, not the first report to arrive (as
torch elastic orders failures by timestamp): every failure carries ``at``, the
wall clock (``time.time()``) where it happened.  The lead, on the first
failure it hears of, waits ``FAILURE_WINDOW_S`` more for reports of failures
that happened earlier but arrive later (a worker's report crosses the network
and waits for the failed process's last stderr lines), then names the earliest.
A failure whose time is not known (``at`` None) ranks after every known one;
equal times rank by arrival.  Pure: no clock, no process.
"""

from __future__ import annotations

import signal

from training_toolkit.agent.events import LocalExit
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR
from training_toolkit.core.records import record
from training_toolkit.job.report import Outcome

# After the first failure, how long reports of earlier failures may take to arrive; then the earliest is the cause.
FAILURE_WINDOW_S = 0.5


@record
class Failure:
    outcome: Outcome
    at: float | None  # wall clock where it happened; None: not known
    stopped: bool = False  # caused by a stopping signal: the job is stopped, never restarted
    host: str | None = None  # the host whose own processes failed (None: a stall, a host's loss, a stop)


def root_cause(failures) -> Failure:
    """The earliest failure by the time it happened; unknown times last; ties by arrival (the order given)."""
    return min(failures, key=lambda f: (f.at is None, f.at or 0.0))


def window_ends(first_arrived: float) -> float:
    """When the lead names the root cause: the window after the first failure it heard of."""
    return first_arrived + FAILURE_WINDOW_S


def peer_failure(host: str, reason: str, exit_code: int, at: float | None, stopped: bool = False) -> Failure:
    """A host's report of its own failure, its reason naming the host ("algo-2: ..." or "algo-2 rank 3: ...")."""
    named = reason if reason.startswith((f"{host}:", f"{host} ")) else f"{host}: {reason}"
    return Failure(Outcome(exit_code, named), at, stopped=stopped, host=host)


def lost(host: str, reason: str, at: float | None) -> Failure:
    """A host the channel lost: no host's own processes failed, so no host is to blame (``host`` None)."""
    return Failure(Outcome(EXIT_CLUSTER_ERROR, f"{host}: left the job ({reason})"), at)


def local_failure(host: str, event: LocalExit) -> Outcome:
    if event.status.ok:  # a helper process (not a primary) ended on its own
        return Outcome(EXIT_CLUSTER_ERROR, f"{host}: {event.name} ended before the job did")
    return event.failure or Outcome(event.status.exit_code, f"{host}: {event.name} {event.status.describe()}")


def stopped(host: str, signum: int) -> Outcome:
    return Outcome(128 + signum, f"{host}: stopped by {signal.Signals(signum).name}")
