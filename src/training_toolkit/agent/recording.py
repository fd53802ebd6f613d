"""The agent's part of the job's record (``training_toolkit.record``): what each step saw, as entries.

``observed`` is pure: an event and the actions the step took on it, the attempt as this host has it,
give the entries they make (kind and fields; the ``Recorder`` adds the time and the host).  Which
events are faults: a failed local process or a failure a host reported (of the current attempt: a
late report of an attempt already over is none), the loss of an active host (a spare's loss is
said, not a fault), a stall (the lead's gathering of stacks), a stopping signal.  Progress: the
first of each attempt only (a restart too: the lead's call, not its own rejoin after it), as the stall watch sees it (no watch, no progress: the record then has
each host's start of its processes).  Checkpoints: every mark a rank made (``agent/progress.py``), its host's
own and every other host's: the lead hears each host's, and tells every host each one (``MarkShared``), so that a
new lead's record has the marks made before it took over.  Restarts: the lead's call, a follower's rejoin, a failover.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from training_toolkit.agent.events import (AnnounceRestart, FailOver, Finish, GatherStacks, GotSignal, LocalExit,
                                           PeerFailed, PeerLost, PeerProgress, Progress, Rejoin, Started)
from training_toolkit.cluster.events import MarkShared, Verdict
from training_toolkit.core.log import log
from training_toolkit.supervise.process import STOPPING_SIGNALS
from training_toolkit.record import schema

if TYPE_CHECKING:
    from training_toolkit.job.attempt import Attempt
    from training_toolkit.job.report import Outcome

Observed = tuple[str, dict]  # kind, fields


def observed(event, actions: Sequence, attempt: int, active: Sequence[str], host: str,
             stopping: bool = False, signalled: bool = False) -> list[Observed]:
    """The entries one step makes: ``event`` and its ``actions``, in ``attempt`` with its ``active`` hosts, on ``host``.
    ``stopping``: the attempt is being stopped for a restart (its processes' ends, and the failures other hosts
    report, are that stop's: no faults).  ``signalled``: this host had a stopping signal (the stop is its fault, and
    its processes' ends, a save's exit 143 among them, are the stop's; each other host's stop is still said)."""
    found: list[Observed] = []
    if isinstance(event, LocalExit | PeerFailed) and stopping or isinstance(event, LocalExit) and signalled:
        pass
    elif isinstance(event, LocalExit) and event.failure is not None and event.attempt == attempt:
        found.append(_fault(attempt, "failure", event.host or host, event.failure.reason, event.at))
    elif isinstance(event, PeerFailed) and event.attempt == attempt:
        found.append(_fault(attempt, "stop" if event.stopped else "failure", event.host, event.reason, event.at))
    elif isinstance(event, PeerLost) and event.host in active:
        found.append(_fault(attempt, "host_lost", event.host, f"{event.host} lost: {event.reason}", event.at))
    elif isinstance(event, GotSignal) and event.signum in STOPPING_SIGNALS:
        found.append(_fault(attempt, "stop", host, f"{signal.Signals(event.signum).name} on {host}", None))
    elif isinstance(event, (Progress, PeerProgress)):
        of = event.attempt if isinstance(event, Progress) else attempt
        found.append(("progress", {"attempt": of, "heartbeat": event.heartbeat}))
        if event.checkpoint:
            found.append(("checkpoint", {"attempt": of, "host": getattr(event, "host", host), "at": None}))
    elif isinstance(event, MarkShared) and event.host != host:
        at = None if event.at is None else round(event.at, 3)  # another host's, when the lead told of it
        found.append(("checkpoint", {"attempt": event.attempt, "host": event.host, "at": at}))
    elif isinstance(event, Started):
        found.append(("started", {"attempt": attempt}))
    for action in actions:
        if isinstance(action, GatherStacks):
            found.append(_fault(attempt, "stall", None, "no progress within the stall timeout", None))
        elif isinstance(action, AnnounceRestart | Rejoin):
            found.append(("restart", {"attempt": action.attempt, "reason": action.reason, "lost": None}))
        elif isinstance(action, FailOver):
            found.append(("restart", {"attempt": action.attempt, "reason": action.reason, "lost": action.lost}))
        elif isinstance(action, Finish):
            found.append(("verdict", {"exit_code": action.outcome.exit_code, "reason": action.outcome.reason}))
    return found


def _fault(attempt: int, kind: str, host: str | None, reason: str | None, at: float | None) -> Observed:
    return ("fault", {"attempt": attempt, "fault": kind, "host": host, "reason": reason,
                      "at": None if at is None else round(at, 3)})


class Recorder:
    """This host's record, written as the agent steps (``step``) and seats (``seated``: the attempt it was seated in); never raises."""

    def __init__(self, output_data_dir: Path, host: str, stall_s: float | None = None, startup_s: float | None = None,
                 clock=time.time):
        self.host = host
        self.stall_s, self.startup_s = stall_s, startup_s  # a stall began this long before it was seen (the stall
        #   timeout; before the attempt's first progress, the startup's)
        self.path = schema.record_path(output_data_dir, host)
        self.cost_path = schema.cost_path(output_data_dir, host)
        self._writer = schema.Writer(self.path)
        self._clock = clock
        self._active: tuple[str, ...] = ()
        self._once: set[tuple[str, int]] = set()  # (kind, attempt) of the progress and restarts written
        self._lost: set[str] = set()  # hosts whose loss is written, until an attempt seats them again
        self.entries: list[dict] = []  # what this host wrote, for its cost at the end
        self.lead_summary: str | None = None  # the lead's line, as its verdict brought it (a follower)

    def joined(self, hosts: Sequence[str]) -> None:
        self._write([("job", {"hosts": list(hosts)})])

    def seated(self, attempt: Attempt) -> None:
        self._active = attempt.active
        self._lost -= set(attempt.active)
        self._write([("attempt", {"attempt": attempt.number, "lead": attempt.lead, "active": list(attempt.active),
                                  "spares": list(attempt.spares)})])

    def step(self, event, actions: Sequence, attempt: int, stopping: bool = False, at: float | None = None,
             signalled: bool = False) -> None:
        """``at``: the wall-clock instant the step was decided (its entries' time), so that the record's spans are
        the decisions' own (a stall stamped 4 s after the progress it followed, not 4 s less the write's delay).
        ``stopping``, ``signalled``: as ``observed``'s."""
        if isinstance(event, Verdict) and event.summary:
            self.lead_summary = event.summary
        found = [item for item in observed(event, actions, attempt, self._active, self.host, stopping, signalled)
                 if self._new(item)]
        if found:
            self._write(found, at)

    def _new(self, item: Observed) -> bool:
        """An attempt's first progress only, its restart once (the lead's call, then its own rejoin), and a host's
        loss once (a lead lost at a barrier is heard there, then again as the next lead's barrier steps the loss)."""
        kind, fields = item
        if kind == "fault" and fields["fault"] == "host_lost":
            if fields["host"] in self._lost:
                return False
            self._lost.add(fields["host"])
            return True
        if kind not in ("progress", "restart"):
            return True
        key = (kind, fields["attempt"])
        if key in self._once:
            return False
        self._once.add(key)
        return True

    def _write(self, found: list[Observed], at: float | None = None) -> None:
        now = self._clock() if at is None else at
        for kind, fields in found:
            if kind == "fault" and fields["fault"] == "stall":  # no progress since then
                span = self.stall_s if ("progress", fields["attempt"]) in self._once else self.startup_s
                fields["at"] = round(now - span, 3) if span else None
        entries = [schema.entry(kind, self.host, now, **fields) for kind, fields in found]
        self.entries.extend(entries)
        self._writer.write(entries)

    def summary_line(self) -> str:
        """The job's cost in one line (``record.summary``), from this record as it stands."""
        from training_toolkit.record import cost, summary

        return summary.line(cost.cost(self.entries))

    def end(self, outcome: Outcome, quiet: bool) -> None:
        """The job's end on this host: its verdict in the record, its cost beside it, and the summary line (a
        follower says its lead's, which the verdict brought).  ``quiet`` (a job of one seat): no line when the job
        ran once without a fault, so that its log is the script's own, byte for byte."""
        from training_toolkit.record import cost, summary

        if not any(item["kind"] == "verdict" for item in self.entries):
            self._write([("verdict", {"exit_code": outcome.exit_code, "reason": outcome.reason})])
        self._writer.close()
        document = cost.cost(self.entries)
        document["summary"] = line = self.lead_summary or summary.line(document)  # what this host says, and reports
        try:
            schema.write_json(self.cost_path, document)
        except OSError as exc:
            log(f"cannot write {self.cost_path}: {exc.strerror or exc}")
        if not (quiet and not document["faults"] and len(document["attempts"]) <= 1):
            log(line)

    def close(self) -> None:
        self._writer.close()
