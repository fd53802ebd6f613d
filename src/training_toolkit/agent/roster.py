"""Who takes part in each attempt: the active hosts in rank order, and the spares (pure).

The platform gives the job its hosts in its own order.  With a maximum
of M hosts below their number, the first M are active and the rest are
**spares**: joined, heartbeating, running no ranks.  At each restart's barrier the lead
chooses the next attempt's roster from the last one and the hosts that are alive then
(``next_roster``), and every host takes it from there:

- a lost or retired host's seat goes to the first waiting spare (platform order), so the
  surviving hosts keep their ranks;
- with no spare left, the seat is dropped: the survivors keep their order and are renumbered,
  while at least the minimum are left; below it the job ends, naming the lost
  hosts and the minimum (``Shortfall``);
- a spare (one that was waiting, or a host that came back) becomes active only at a restart the
  job makes anyway, up to M, after the others: no restart is made only to grow;
- a host whose own ranks caused the last ``RETIRE_AFTER`` failures in a row is retired when a spare
  waits (``to_retire``): a host that stays up but keeps failing (a bad GPU) gives its seat away;
- the lead stays first: it holds the control channel and every runner's coordinator (rank 0);
  when it is lost, its successor (``agent/succession.py``) takes its seat (``led_by``) and the
  successor's own seat is then the one lost: a spare takes it, or the job shrinks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from training_toolkit.core.records import record

RETIRE_AFTER = 2  # failures in a row caused by one host's own ranks, after which a waiting spare takes its seat


@record
class Roster:
    """One attempt's hosts: ``active`` in rank order (the lead first), ``spares`` in the order they are called.

    ``retired``: hosts that gave their seat away after failing (``to_retire``): joined still, never seated again.
    """

    active: tuple[str, ...]
    spares: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()


@record
class Shortfall:
    """Fewer hosts than the minimum are left: the job cannot go on."""

    lost: tuple[str, ...]
    left: tuple[str, ...]
    minimum: int

    def reason(self) -> str:
        return (f"{len(self.left)} host(s) left ({', '.join(self.left)}) after losing {', '.join(self.lost)}: "
                f"fewer than the minimum of {self.minimum}, and no spare waiting")


@record
class Turn:
    """The next attempt's roster and what changed, in words for the attempt's line."""

    roster: Roster
    changes: tuple[str, ...] = ()


def limits(hosts: int, max_hosts: int | None, min_hosts: int | None) -> tuple[int, int]:
    """The job's (maximum, minimum) of active hosts for ``hosts`` platform hosts; ValueError naming the settings.

    Defaults: every host, and the minimum the maximum (a lost host without a spare ends the job).
    """
    top = hosts if max_hosts is None else max_hosts
    bottom = top if min_hosts is None else min_hosts
    if top > hosts:
        raise ValueError(f"TRAINING_TOOLKIT_MAX_HOSTS={top} is more than the job's {hosts} host(s)")
    if bottom > top:
        raise ValueError(f"TRAINING_TOOLKIT_MIN_HOSTS={bottom} is more than TRAINING_TOOLKIT_MAX_HOSTS={top}"
                         + ("" if max_hosts is not None else f" (all {hosts} hosts)"))
    return top, bottom


def elastic(hosts: int, max_hosts: int, min_hosts: int) -> bool:
    """Whether the job has spares or may shrink: a lost host need not end it."""
    return max_hosts < hosts or min_hosts < max_hosts


def first_roster(hosts: Sequence[str], max_hosts: int | None) -> Roster:
    """The first attempt's: the platform's first ``max_hosts`` hosts (all without a maximum), the rest spares."""
    count = len(hosts) if max_hosts is None else min(max_hosts, len(hosts))
    return Roster(tuple(hosts[:count]), tuple(hosts[count:]))


def next_roster(last: Roster, alive: frozenset[str] | set[str], *, max_hosts: int | None = None,
                min_hosts: int | None = None, retire: frozenset[str] = frozenset(),
                why: Mapping[str, str] | None = None) -> Turn | Shortfall:
    """The next attempt's roster, from the last one and the hosts alive at its barrier.

    ``alive``: the hosts joined and answering (the lead always is: when the lead is lost, its
    successor calls this on ``led_by``'s roster).  ``retire``: active hosts to give their seat to a waiting spare (``to_retire``);
    one with no spare waiting keeps its seat.  ``max_hosts`` None: as many as the last roster had;
    ``min_hosts`` None: that same number (a lost host without a spare ends the job).  ``why``: a
    lost host's reason, for the line (``algo-2 lost: no answer for 10 s``).
    """
    why = why or {}
    size = len(last.active) if max_hosts is None else max_hosts
    minimum = size if min_hosts is None else min_hosts
    waiting = [h for h in last.spares if h in alive]
    seats: list[str] = []
    changed: list[str] = []
    retired = list(last.retired)
    for index, host in enumerate(last.active):
        lost = host not in alive
        retiring = not lost and index > 0 and host in retire and bool(waiting)
        if not (lost or retiring):
            seats.append(host)
            continue
        spare = waiting.pop(0) if waiting else None
        if retiring:
            retired.append(host)
            changed.append(f"{host} retired after {RETIRE_AFTER} failures; {spare} takes its place")
        else:
            changed.append(f"{host} lost" + (f": {why[host]}" if host in why else "")
                           + (f"; {spare} takes its place" if spare else ""))
        if spare is not None:
            seats.append(spare)
    while waiting and len(seats) < size:  # back up to the maximum, at this restart only
        spare = waiting.pop(0)
        seats.append(spare)
        changed.append(f"{spare} seated")
    if len(seats) < minimum:
        return Shortfall(tuple(h for h in last.active if h not in alive), tuple(seats), minimum)
    # a lost host, active or spare, is out of the roster: if it comes back it joins as a spare (``joined``)
    return Turn(Roster(tuple(seats), tuple(waiting), tuple(retired)), tuple(changed))


def led_by(roster: Roster, lead: str) -> Roster:
    """``roster`` whose lead was lost, led by ``lead`` (an active host): it takes the lost lead's seat (rank 0), and
    the lost lead sits in its old seat, where ``next_roster`` then seats a spare or drops it.  A spare as the new
    lead takes the first seat, the lost lead the spare's place (gone with it: a lost spare is out of the roster)."""
    active, lost = list(roster.active), roster.active[0]
    if lead in active:
        active[active.index(lead)] = lost
        active[0] = lead
        return Roster(tuple(active), roster.spares, roster.retired)
    active[0] = lead
    return Roster(tuple(active), tuple(host for host in roster.spares if host != lead), roster.retired)


def to_retire(causes: Sequence[str | None], after: int = RETIRE_AFTER) -> frozenset[str]:
    """The host whose own ranks caused each of the last ``after`` failures (``causes``: each attempt's, oldest first).

    ``None`` is a failure no single host's ranks caused (a stall, a lost host's silence): it breaks a run.
    """
    if len(causes) < after:
        return frozenset()
    last = causes[-after:]
    return frozenset({last[0]}) if last[0] is not None and all(c == last[0] for c in last) else frozenset()


def joined(roster: Roster, host: str) -> Roster:
    """``roster`` with ``host`` (a host that came back, or a new one) waiting at the end of the spares."""
    if host in roster.active or host in roster.spares or host in roster.retired:
        return roster
    return Roster(roster.active, (*roster.spares, host), roster.retired)


def attempt_line(attempt: int, attempts: int, turn: Turn) -> str:
    """``attempt 2 of 4: algo-1, algo-5, algo-3 (algo-2 lost: no answer for 10 s; algo-5 takes its place)``."""
    roster = turn.roster
    notes = [*turn.changes, *([f"spares: {', '.join(roster.spares)}"] if roster.spares else [])]
    return f"attempt {attempt} of {attempts}: {', '.join(roster.active)}" + (f" ({'; '.join(notes)})" if notes else "")
