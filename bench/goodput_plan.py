"""The goodput benchmark's pure parts: the seeded fault schedule, whom a fault kills, and the arithmetic.

A **fault** kills one whole host other than the first (schedule (c): any host, the first included;
every process in it, SIGKILL, as a node dies) ``at_s`` seconds after the job's start, and the platform brings a replacement back in the
same host (name, address, ``/opt/ml``) ``back_s`` seconds after the kill.  The full schedule
(``scale`` 1): a fault every 20 s (seeded jitter of +-2 s, so a host is always back before the next
kill) for 120 s, each host back 15 s after its kill.  ``scale`` multiplies every time, so
``scale 0.5`` kills every ~10 s for 60 s and brings each host back after 7.5 s.

Goodput is the work's length over the job's wall time: ``steps * step_s`` (the time the steps
would take with every host there and no fault) over the time from the job's start to the first
host's end.  A step on fewer hosts than the full world takes ``full / world`` times as long (the
same global batch on fewer hosts), so a job that shrinks pays for it in its wall time.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

PERIOD_S, SPAN_S, BACK_S, JITTER_S = 20.0, 120.0, 15.0, 2.0


class Fault(NamedTuple):
    at_s: float  # seconds after the job's start
    pick: float  # in [0, 1): which of the candidates (``victim``)
    back_s: float  # seconds after the job's start when the host comes back


def schedule(seed: int, scale: float = 1.0, period_s: float = PERIOD_S, span_s: float = SPAN_S,
             back_after_s: float = BACK_S, jitter_s: float = JITTER_S) -> list[Fault]:
    """Faults at ``period_s`` intervals (+- ``jitter_s``) from ``period_s`` up to ``span_s``, all times x ``scale``.

    The same seed gives the same schedule, for every system under test.
    """
    if scale <= 0:
        raise ValueError(f"scale must be above 0, not {scale}")
    if back_after_s + 2 * jitter_s >= period_s:
        raise ValueError(f"a host must be back ({back_after_s:g} s) before the next fault "
                         f"({period_s:g} +- {jitter_s:g} s)")
    rng = random.Random(seed)
    faults, index = [], 1
    while period_s * index <= span_s:
        at = period_s * index + rng.uniform(-jitter_s, jitter_s)
        faults.append(Fault(round(at * scale, 3), rng.random(), round((at + back_after_s) * scale, 3)))
        index += 1
    return faults


def victim(pick: float, running: Iterable[str], up: Iterable[str], first: str | None) -> str | None:
    """The host a fault kills: one of the hosts running a rank now, else one of those up; never ``first``
    (None: the first host is a victim like any other, schedule (c)).

    Candidates are taken in name order and ``pick`` chooses among them, so a seed means the same
    choice wherever the same hosts run ranks.  None: no host but the first is up.
    """
    for group in (running, up):
        candidates = sorted(set(group) - {first})
        if candidates:
            return candidates[min(int(pick * len(candidates)), len(candidates) - 1)]
    return None


def work_s(steps: int, step_s: float) -> float:
    return steps * step_s


def goodput(work: float, wall: float) -> float:
    """The share of the wall time that was the work's: 1.0 for a job that lost nothing."""
    if wall <= 0:
        raise ValueError(f"wall time must be above 0, not {wall}")
    return work / wall


def attempts_by_time(stamps: Iterable[float], gap_s: float = 2.0) -> dict[int, list[float]]:
    """Ranks' start stamps grouped into attempts by time: a gap above ``gap_s`` starts the next attempt.

    One rule for every system compared: a rank stamps once its group has formed, so an attempt's ranks
    stamp within a moment of each other, and the next attempt comes only after a kill, its detection and
    the ranks' own start.  (An attempt counter would not do: a replaced host's torchrun or Horovod worker
    counts its restarts from 0.)
    """
    groups: dict[int, list[float]] = {}
    last = None
    for stamp in sorted(stamps):
        if last is None or stamp - last > gap_s:
            groups[len(groups)] = []
        groups[len(groups) - 1].append(stamp)
        last = stamp
    return groups


def recoveries(kills: Sequence[tuple[str, float]], started: Mapping[int, Sequence[float]],
               which: Callable[[Sequence[float]], float] = max) -> list[float | None]:
    """For each kill (host, time): seconds to every rank of the first attempt started after it running
    (``which=min``: to its first rank running).

    ``started``: each attempt's ranks' start stamps (after their process group formed), the same clock
    as the kills.  None: no attempt started after that kill (the job ended first, or a later kill came
    before it had).  An attempt counts for the last kill before its first rank started.
    """
    out: list[float | None] = []
    ordered = sorted(started.items(), key=lambda item: min(item[1]))
    for index, (_, at) in enumerate(kills):
        until = kills[index + 1][1] if index + 1 < len(kills) else float("inf")
        after = [stamps for _, stamps in ordered if at < min(stamps) < until]
        out.append(which(after[0]) - at if after else None)
    return out


def spread(values: Sequence[float], unit: str = "", digits: int = 3) -> str:
    """``median (min-max)`` of several runs' figures, one run's alone, or an em dash for none."""
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}{unit}"
    return (f"{statistics.median(values):.{digits}f}{unit} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def row(label: str, work: float, wall: float | None, note: str = "") -> str:
    """One line of the table: the system, its wall time and goodput, or why it has none."""
    if wall is None:
        return f"  {label:44s} {'—':>8s} {'—':>8s}  {note}"
    return f"  {label:44s} {wall:7.1f}s {goodput(work, wall):8.3f}  {note}"


def record_splits(kills: Sequence[tuple[str, float]], faults: Sequence[Mapping]) -> list[dict | None]:
    """For each kill (host, wall time): what the job's record says it cost (``record/cost.py``'s fault of that host's
    loss, seen at or after the kill), with the detection timed from outside (the kill to the record's detection).
    None: the record has no such fault (the kill came between attempts, say)."""
    out: list[dict | None] = []
    for host, at in kills:
        found = next((f for f in faults if f["fault"] == "host_lost" and f["host"] == host
                      and f["detected_t"] >= at - 0.5 and f["lost_s"] is not None), None)
        if found is None:
            out.append(None)
            continue
        out.append({"host": host, "outside_detection_s": round(found["detected_t"] - at, 3),
                    "detection_s": found["detection_s"], "barrier_s": found["barrier_s"], "start_s": found["start_s"],
                    "to_progress_s": round(found["detected_t"] - at + found["barrier_s"] + found["start_s"], 3)})
    return out
