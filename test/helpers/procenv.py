"""A variable of a process's environment, as the process started: what a test reads of a process it did not start."""

from __future__ import annotations


def environ_value(pid: int, name: str) -> str | None:
    """One variable of ``/proc/PID/environ``; None if unset or the process is gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None
