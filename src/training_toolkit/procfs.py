"""A light view of the process table from ``/proc``: who descends from whom, and in which group.

Used at the end of every run to find what a script left behind.  Reading
``/proc`` directly costs a few milliseconds and no import of psutil, which
matters because it happens on every launch.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class Proc(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    zombie: bool


def snapshot() -> dict[int, Proc]:
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: fields start after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        table[int(entry)] = Proc(int(entry), int(fields[1]), int(fields[2]), fields[0] == b"Z")
    return table


def descendants(root: int, table: dict[int, Proc] | None = None) -> list[Proc]:
    table = snapshot() if table is None else table
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return found


def has_marker(pid: int, marker: bytes) -> bool:
    """Whether ``marker`` (``NAME=value``) is one of the process's environment entries."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def marked_descendants(root: int, marker: bytes, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Live descendants of ``root`` whose environment holds ``marker``."""
    return [p.pid for p in descendants(root) if not p.zombie and p.pid not in exclude and has_marker(p.pid, marker)]
