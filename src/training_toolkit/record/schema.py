"""The record's one format: JSON lines, one entry per line, versioned; written as it goes, read back tolerantly.

Every entry has ``v`` (``VERSION``), ``t`` (the wall clock, seconds since the epoch, when this host saw
it), ``by`` (the host that wrote it) and ``kind``; the rest depends on the kind (``KINDS``).  Each
line is flushed as it is written: a ``train`` killed at any moment leaves every entry up to then (a
line cut short by a kill mid-write is skipped when read).  Each host writes its own file,
``record-<host>.jsonl``, and at the end the cost, ``cost-<host>.json``, both under
``<output data dir>/training-toolkit/`` (``/opt/ml/output/data``, which SageMaker uploads with the job).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

VERSION = 1
DIR_NAME = "training-toolkit"

#: kind -> the fields an entry of that kind has besides v, t, by, kind (docs/resilience.md explains each)
KINDS = {
    "job": ("hosts",),  # this host took its seat: the job's hosts, in the platform's order
    "attempt": ("attempt", "lead", "active", "spares"),  # a barrier passed: the attempt, as every host has it
    "started": ("attempt",),  # this host started its processes of the attempt (a spare starts none)
    "progress": ("attempt", "heartbeat"),  # the attempt's first progress this host saw (the stall watch's)
    "checkpoint": ("attempt", "host", "at"),  # a rank on ``host`` marked a checkpoint saved (agent/progress.py); ``at``:
    #                                          when, for a mark the lead told of (its clock); null: at ``t``
    "fault": ("attempt", "fault", "host", "reason", "at"),  # a fault this host saw (``FAULTS``)
    "restart": ("attempt", "reason", "lost"),  # the job goes on to ``attempt`` (``lost``: a failover's lost lead)
    "verdict": ("exit_code", "reason"),  # the job's end, as this host ends
}
FAULTS = ("failure", "host_lost", "stall", "stop")


def record_path(directory: Path, host: str) -> Path:
    return directory / DIR_NAME / f"record-{host}.jsonl"


def cost_path(directory: Path, host: str) -> Path:
    return directory / DIR_NAME / f"cost-{host}.json"


def entry(kind: str, by: str, t: float, **fields) -> dict:
    """One entry, written by host ``by``, checked against its kind's fields (a mistake of ours: an AssertionError)."""
    assert kind in KINDS and set(fields) == set(KINDS[kind]), (kind, sorted(fields))
    return {"v": VERSION, "t": round(t, 3), "by": by, "kind": kind, **fields}


class Writer:
    """Appends entries to one host's record; opened at the first entry; never raises (a record is no reason to fail
    a job: a write that fails is said once, and the record stops there)."""

    def __init__(self, path: Path):
        self.path = path
        self._file: IO[str] | None = None
        self._broken = False

    def write(self, entries: Iterable[dict]) -> None:
        if self._broken:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")
            for item in entries:
                self._file.write(json.dumps(item, separators=(",", ":")) + "\n")
            self._file.flush()  # in the kernel's hands: a kill of train loses nothing written
        except OSError as exc:
            self._broken = True
            from training_toolkit.core.log import log

            log(f"the job's record stops here: cannot write {self.path}: {exc.strerror or exc}")

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


def read(path: Path) -> list[dict]:
    """A record's entries in order; lines that are not an entry of a known version (one cut short) are skipped."""
    entries = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("v") == VERSION and item.get("kind") in KINDS:
            entries.append(item)
    return entries


def said_summary(directory: Path, host: str) -> str | None:
    """The summary line ``host`` said at its end (its cost document's), for a platform's own report; None if none."""
    try:
        found = json.loads(cost_path(directory, host).read_text(encoding="utf-8")).get("summary")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def write_json(path: Path, document: dict) -> None:
    """A whole document (the cost), replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
