"""The lead's barrier, decided: who is ready for an attempt, who is missing at its deadline, and why.

The channel's server decides nothing: it posts what it hears (a host joined,
said it is ready, was lost and why, reported a failure) to the agent's queue.
Every such event goes into the ``Roll`` whatever the phase (a host may rejoin
and say it is ready for the next attempt while this one still runs); a
barrier (``Barrier``, opened by the shell) is then decided on each event and
on each ``Tick``:

1. a failure heard for the barrier's attempt (a host's loss too, unless the
   barrier waits for the hosts alive only): once the root-cause window after
   the first one has passed, the earliest (``failures.root_cause``) ends the job;
2. every expected host ready (alive only: every one still linked): the barrier
   passes, with the hosts ready (the lead among them) and why each lost
   host was lost (for the roster); a new lead's first barrier (``members``)
   counts every host linked and ready, a member or not (one that came back
   while the last attempt ran), and waits for ``needed`` of them (the job's
   minimum) until its deadline;
3. the deadline passed: the job ends naming who never joined, who left the job
   and did not join again, and who joined but was never ready.

Pure: ``now`` is the shell's monotonic clock.  Table tests: test/unit/agent/test_barrier.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from training_toolkit.agent.failures import Failure, lost, peer_failure, root_cause, window_ends
from training_toolkit.agent.succession import has_majority
from training_toolkit.cluster.events import PeerFailed, PeerJoined, PeerLost, PeerReady
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR, EXIT_NO_MAJORITY
from training_toolkit.core.records import record, replace
from training_toolkit.job.report import Outcome


@record
class Heard:
    """A failure the lead heard of, kept for a barrier: the attempt it is of, when it arrived (monotonic)."""

    failure: Failure
    attempt: int
    arrived: float
    loss: bool = False  # a host's loss: no failure at a barrier that waits for the hosts alive only


@record
class Roll:
    """The lead: what the channel said of every other host."""

    linked: frozenset[str] = frozenset()  # seated now
    joined: frozenset[str] = frozenset()  # ever seated (lost ones included)
    # the last attempt each host said it is ready for; why each lost host was lost (the last time). Mappings
    # (copied on change, never changed in place): at 1,000 hosts a barrier hears 2,000 events
    ready: Mapping[str, int] = {}
    lost_why: Mapping[str, str] = {}
    heard: tuple[Heard, ...] = ()  # failures of the channel's attempt or a later one, in arrival order


@record
class Barrier:
    """The barrier of ``attempt``: ``expected`` (every other host, in rank order) ready by ``deadline``."""

    attempt: int
    expected: tuple[str, ...]
    deadline: float  # monotonic
    deadline_s: float  # as the message says it
    alive_only: bool = False  # a restart's barrier with spares or a minimum: only the hosts still linked
    members: tuple[str, ...] = ()  # a new lead's first barrier (its lead was lost): the job's members; it waits for
    #   every expected host, a loss no failure, and passes at its deadline with a majority of them (``succession``)
    needed: int = 0  # such a barrier: the hosts the next attempt needs (the job's minimum), the lead included; until
    #   its deadline it waits for them, members or hosts that came back, beyond the expected ones


@record
class Passed:
    ready: frozenset[str]  # the hosts ready, the lead among them
    why: Mapping[str, str]  # why each lost host was lost


@record
class Failed:
    outcome: Outcome


@record
class Waiting:
    until: float  # monotonic: decide again on a Tick then


def note(roll: Roll, event, now: float, channel_attempt: int) -> Roll:
    """What an event of the channel changes in the roll (``channel_attempt``: the attempt the channel is at)."""
    if isinstance(event, PeerJoined):
        return replace(roll, linked=roll.linked | {event.host}, joined=roll.joined | {event.host})
    if isinstance(event, PeerReady):
        if event.attempt < channel_attempt:  # a host that rejoined may be ready for a restart not yet called
            return roll
        return replace(roll, ready={**roll.ready, event.host: event.attempt})
    if isinstance(event, PeerLost):
        heard = Heard(lost(event.host, event.reason, event.at), channel_attempt, now, loss=True)
        return replace(roll, linked=roll.linked - {event.host}, lost_why={**roll.lost_why, event.host: event.reason},
                       heard=(*roll.heard, heard))
    if isinstance(event, PeerFailed) and event.attempt >= channel_attempt:
        failure = peer_failure(event.host, event.reason, event.exit_code, event.at, event.stopped)
        return replace(roll, heard=(*roll.heard, Heard(failure, event.attempt, now)))
    return roll


def opened(roll: Roll, attempt: int) -> Roll:
    """A barrier opens: failures of earlier attempts are over (their attempt failed or was restarted)."""
    return replace(roll, heard=tuple(h for h in roll.heard if h.attempt >= attempt))


def decide(first: str, roll: Roll, barrier: Barrier, now: float) -> Passed | Failed | Waiting:
    """The barrier's outcome now, or when to look again."""
    lenient = barrier.alive_only or bool(barrier.members)  # a loss is no failure: the hosts left go on
    failures = [h for h in roll.heard if h.attempt == barrier.attempt and not (lenient and h.loss)]
    if failures:  # the earliest, once reports of earlier failures had the window to arrive
        ends = window_ends(failures[0].arrived)
        if now >= ends:
            return Failed(root_cause([h.failure for h in failures]).outcome)
        return Waiting(ends)
    missing = [h for h in barrier.expected if roll.ready.get(h) != barrier.attempt
               and (not barrier.alive_only or h in roll.linked)]
    if barrier.members:  # any host linked and ready counts: a member, or one that came back while the last attempt ran
        ready = {h for h in roll.linked if roll.ready.get(h) == barrier.attempt}
    else:
        ready = {h for h in barrier.expected if roll.ready.get(h) == barrier.attempt and h in roll.linked}
    if not missing and len({first, *ready}) >= barrier.needed:
        return Passed(frozenset({first, *ready}), roll.lost_why)
    if now >= barrier.deadline:
        if barrier.members:
            if has_majority({first, *ready}, barrier.members):
                return Passed(frozenset({first, *ready}), roll.lost_why)
            behind = len({first, *ready} & set(barrier.members))
            return Failed(Outcome(EXIT_NO_MAJORITY, f"{first}: no majority to lead the job: "
                                  f"{behind} of its {len(barrier.members)} members "
                                  f"({', '.join(barrier.members)}) ready within {barrier.deadline_s:g} s "
                                  f"({not_ready(roll, missing, barrier.deadline_s)})"))
        return Failed(Outcome(EXIT_CLUSTER_ERROR, f"{first}: {not_ready(roll, missing, barrier.deadline_s)}"))
    return Waiting(barrier.deadline)


def not_ready(roll: Roll, missing: Sequence[str], deadline_s: float) -> str:
    """Who is missing at the deadline, and how: never joined, left and did not join again, or never ready."""
    absent = [h for h in missing if h not in roll.linked and h not in roll.joined]
    left_job = [h for h in missing if h not in roll.linked and h in roll.joined]
    joined = [h for h in missing if h in roll.linked]
    parts = []
    if absent:
        parts.append(f"never joined: {', '.join(absent)}")
    if left_job:
        parts.append(f"left the job and did not join again: {', '.join(left_job)}")
    if joined:
        parts.append(f"joined but never ready: {', '.join(joined)}")
    return f"hosts not ready within {deadline_s:g} s ({'; '.join(parts)})"
