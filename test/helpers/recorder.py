"""A launcher's output kept line by line with when each line arrived, for tests and benches that time a job."""

from __future__ import annotations

import sys
import time


class Recorder:
    """The launcher's output, each line with its arrival (monotonic); echoed when ``echo``."""

    def __init__(self, echo: bool = False):
        self.lines: list[tuple[float, bytes]] = []
        self._buf = b""
        self._echo = echo

    def write(self, data: bytes) -> int:
        if self._echo:
            sys.stdout.buffer.write(data)
        self._buf += data
        *done, self._buf = self._buf.split(b"\n")
        now = time.monotonic()
        self.lines += [(now, line) for line in done]
        return len(data)

    def flush(self) -> None:
        sys.stdout.buffer.flush()

    def last(self, marker: bytes) -> float:
        return max(t for t, line in self.lines if marker in line)

    def text(self) -> str:
        return b"\n".join(line for _, line in self.lines).decode(errors="replace")
