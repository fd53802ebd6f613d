"""What a job's faults cost, from its record (pure: entries in, one document out).

Times are this host's wall clock (``t``): ``at``, when a reported fault happened by its own host's clock,
only splits detection from the rest, bounded by its ``t``.  An attempt runs from its barrier (its
``attempt`` entry) to the next attempt's barrier or the verdict; its ranks run from its first progress
(or, without progress in the record, from this host's start of its processes: ``basis``).  Each restart
is charged to the first fault of the attempt it ended (the cause), and costs the time from that fault's
detection to the next attempt's first progress, split into detection (the fault to its detection),
barrier (detection to the next attempt's barrier) and start (that barrier to its first progress).
A restart whose fault this host did not see (a follower hears the lead's call only) is charged as
a fault of kind ``restart`` with the call's reason, from when the call came.

Work lost: where the script marks its checkpoints (``checkpoint`` entries: agent/progress.py), each fault
also loses the work its attempt did since the last mark before the fault (or since the attempt's first
progress, if it marked none since then), and ``goodput`` is the ranks' running time less that lost work,
over the wall time.  A record with no mark has ``lost_work_included`` false and no goodput: the running
fraction then overstates it by the work redone after each restart.
"""

from __future__ import annotations

from collections.abc import Sequence

COST_VERSION = 1


def cost(entries: Sequence[dict]) -> dict:
    """The cost document of one host's record (docs/resilience.md, "What faults cost")."""
    if not entries:
        return {"v": COST_VERSION, "wall_s": 0.0, "attempts": [], "faults": [], "downtime_s": 0.0,
                "running_fraction": None, "basis": "none", "lost_work_included": False, "checkpoints": 0,
                "lost_work_s": None, "goodput": None, "verdict": None}
    begin = entries[0]["t"]
    verdict = next((e for e in entries if e["kind"] == "verdict"), None)
    end = verdict["t"] if verdict else entries[-1]["t"]
    basis = "progress" if any(e["kind"] == "progress" for e in entries) else "started"
    seats = _first_each(entries, "attempt")
    ran = _first_each(entries, basis)
    numbers = sorted(seats)
    attempts = []
    for i, number in enumerate(numbers):
        start = seats[number]["t"]
        stop = seats[numbers[i + 1]]["t"] if i + 1 < len(numbers) else end
        first = ran.get(number, {}).get("t")
        attempts.append({"attempt": number, "lead": seats[number]["lead"], "active": seats[number]["active"],
                         "spares": seats[number]["spares"], "barrier_t": start,
                         "to_progress_s": _span(start, first), "running_s": _span(first, stop)})
    marks = sorted(_marked_at(e) for e in entries if e["kind"] == "checkpoint")
    faults = []
    for i, number in enumerate(numbers):
        cause = next((e for e in entries if e["kind"] == "fault" and e["attempt"] == number), None) or \
            _told(entries, number)
        if cause is None:
            continue
        detected = cause["t"]
        happened = min(cause["at"], detected) if isinstance(cause["at"], (int, float)) else detected
        after = numbers[i + 1] if i + 1 < len(numbers) else None
        barrier = seats[after]["t"] if after is not None else None
        progressed = ran.get(after, {}).get("t") if after is not None else None
        told = _told(entries, number)  # a stall's restart names the stuck rank, once the stacks were read
        reason = told["reason"] if cause["fault"] == "stall" and told is not None else cause["reason"]
        faults.append({"attempt": number, "fault": cause["fault"], "host": cause["host"], "reason": reason,
                       "detected_t": detected, "detection_s": round(detected - happened, 3),
                       "barrier_s": _span(detected, barrier), "start_s": _span(barrier, progressed),
                       "lost_s": _span(happened, progressed) if after is not None else None,
                       "lost_work_s": _lost_work(marks, ran.get(number, {}).get("t"), happened) if marks else None,
                       "next_attempt": after})
    wall = round(end - begin, 3)
    running = sum(a["running_s"] or 0.0 for a in attempts)
    lost_work = round(sum(f["lost_work_s"] or 0.0 for f in faults), 3) if marks else None
    return {"v": COST_VERSION, "wall_s": wall, "attempts": attempts, "faults": faults,
            "downtime_s": round(sum(f["lost_s"] or 0.0 for f in faults), 3),
            "running_fraction": round(running / wall, 4) if wall > 0 else None, "basis": basis,
            "lost_work_included": bool(marks), "checkpoints": len(marks), "lost_work_s": lost_work,
            "goodput": round(max(0.0, running - lost_work) / wall, 4) if marks and wall > 0 else None,
            "verdict": None if verdict is None else {"exit_code": verdict["exit_code"], "reason": verdict["reason"]}}


def _told(entries: Sequence[dict], number: int) -> dict | None:
    """A restart after ``number`` whose fault this host did not see itself (a follower hears only the lead's call):
    the fault as the restart told it, seen when the restart was."""
    restart = next((e for e in entries if e["kind"] == "restart" and e["attempt"] == number + 1), None)
    if restart is None:
        return None
    return {"t": restart["t"], "fault": "restart", "host": None, "reason": restart["reason"], "at": None}


def _lost_work(marks: Sequence[float], progressed: float | None, happened: float) -> float:
    """The work a fault at ``happened`` lost: since the last mark before it, but not before its attempt's first
    progress (``progressed``; None: its ranks never ran, nothing was lost)."""
    if progressed is None or happened <= progressed:
        return 0.0
    last = max((t for t in marks if t <= happened), default=progressed)
    return round(happened - max(last, progressed), 3)


def _first_each(entries: Sequence[dict], kind: str) -> dict[int, dict]:
    found: dict[int, dict] = {}
    for item in entries:
        if item["kind"] == kind:
            found.setdefault(item["attempt"], item)
    return found


def _marked_at(mark: dict) -> float:
    """When a checkpoint was marked: by the lead's clock for a mark it told of (``at``), else when this host saw it."""
    at = mark.get("at")  # a record of a version before marks were stamped has none
    return at if isinstance(at, (int, float)) else mark["t"]


def _span(start: float | None, stop: float | None) -> float | None:
    return None if start is None or stop is None else round(max(0.0, stop - start), 3)
