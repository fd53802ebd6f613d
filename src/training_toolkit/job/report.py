"""The verdict: an exit code, and ``output/success`` or ``output/failure`` with the root cause.

The platform shows the first 1024 characters of the failure file, so the file
starts with one line that names the cause; details (command, stderr tail)
follow.  A failure file the user's script wrote itself is never overwritten.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import NamedTuple

from training_toolkit.core.paths import Paths

FAILURE_LIMIT = 1024 * 64


class Outcome(NamedTuple):
    exit_code: int
    reason: str | None = None  # one line naming the cause; None on success
    command: tuple[str, ...] = ()
    stderr_tail: tuple[str, ...] = ()
    details: tuple[str, ...] = ()  # more about the cause (a stall's stacks, earlier attempts' causes), first in the file

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def failure_text(self) -> str:
        lines = [self.reason or f"exited with code {self.exit_code}"]
        if self.details:
            lines += ["", *self.details]
        if self.command:
            lines += ["", "command: " + shlex.join(self.command)]
        if self.stderr_tail:
            lines += ["", "last lines of stderr:", *self.stderr_tail]
        return "\n".join(lines)[:FAILURE_LIMIT] + "\n"


def summary_line(description: str, tail: Sequence[str]) -> str:
    """``description`` plus the last meaningful stderr line, usually the exception."""
    for line in reversed(tail):
        text = line.strip()
        if text and text.strip("-=*_ ") != "":  # not one of the rules Open MPI draws around its messages
            return f"{description}: {text}"[:900]
    return description


def clear_verdict(paths: Paths) -> None:
    """A run starts without a verdict, so a stale one from an earlier run cannot be mistaken for ours."""
    for path in (paths.success_file, paths.failure_file):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            pass


def write_verdict(paths: Paths, outcome: Outcome) -> None:
    try:
        paths.output_dir.mkdir(parents=True, exist_ok=True)
        if outcome.ok:
            paths.success_file.touch()
        elif not paths.failure_file.exists():
            paths.failure_file.write_text(outcome.failure_text(), encoding="utf-8")
    except OSError:
        pass  # a read-only or vanished output dir must not hide the exit code
