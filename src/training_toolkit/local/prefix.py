"""Hosts' output, live, each line prefixed by its host: one writer per stream, one lock per job."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import BinaryIO


def host_prefix(host: str, width: int) -> bytes:
    """``[algo-1] `` padded so that the hosts' lines line up."""
    return f"[{host.ljust(width)}] ".encode()


class LinePrefixer:
    """Copies chunks of one stream to ``sink`` line by line, each line prefixed; a partial line waits for its end."""

    def __init__(self, sink: BinaryIO, prefix: bytes, lock: threading.Lock):
        self._sink, self._prefix, self._lock = sink, prefix, lock
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        if lines:
            self._emit(b"".join(self._prefix + line + b"\n" for line in lines))

    def close(self) -> None:
        """The stream ended: its last, unterminated line goes out with a newline."""
        if self._pending:
            self._emit(self._prefix + self._pending + b"\n")
            self._pending = b""

    def _emit(self, data: bytes) -> None:
        with self._lock:
            try:
                self._sink.write(data)
                self._sink.flush()
            except (OSError, ValueError):
                pass


class Pump:
    """A thread feeding a LinePrefixer from ``chunks`` (an iterable of bytes) until it ends."""

    def __init__(self, chunks: Iterable[bytes], prefixer: LinePrefixer, on_end=None):
        self._chunks, self._prefixer, self._on_end = chunks, prefixer, on_end
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for chunk in self._chunks:
                self._prefixer.feed(chunk)
        except Exception:  # a stream cut by teardown (engine connection closed): what came is out
            pass
        finally:
            self._prefixer.close()
            if self._on_end is not None:
                self._on_end()


def read_chunks(source: BinaryIO) -> Iterable[bytes]:
    """A pipe's content as it arrives; the pipe is closed at its end."""
    try:
        while chunk := os.read(source.fileno(), 65536):
            yield chunk
    finally:
        source.close()
