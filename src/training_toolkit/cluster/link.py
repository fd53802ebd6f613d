"""One control-channel connection, and the small socket helpers both ends share."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

from training_toolkit.cluster import wire
from training_toolkit.core.errors import ClusterError
from training_toolkit.cluster.limits import open_files_needed, raise_open_files


class Link:
    """One connection: raw frames during the join, then signed, sequenced frames in both directions."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock = sock
        self.peer = peer
        self.key = b""
        self._buffer = b""
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()

    def send_raw(self, message: dict) -> None:
        with self._send_lock:
            self.sock.sendall(wire.encode(message))

    def recv_raw(self, deadline: float | None = None, limit: int = wire.MAX_FRAME) -> dict:
        """The next frame (at most ``limit`` bytes); by ``deadline`` (monotonic) if given, else within the socket's own timeout."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > limit:
                raise wire.FrameError(f"frame longer than {limit} bytes")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed" + (" mid-frame" if self._buffer else ""))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return wire.decode(line + b"\n", limit)

    def send(self, kind: str, **fields) -> None:
        self.send_shared(kind, None, **fields)

    def send_shared(self, kind: str, shared: dict[str, str] | None, **fields) -> None:
        """``send``, with fields already encoded once for many links (``wire.shared_fields``)."""
        with self._send_lock:
            self._send_seq += 1
            self.sock.sendall(wire.sign(self.key, self._send_seq, kind, fields, shared))

    def recv(self, limit: int = wire.MAX_FRAME) -> dict:
        return self._open(self.recv_raw(limit=limit))

    @property
    def buffered(self) -> bool:
        return bool(self._buffer)

    def first_raw(self, chunk: bytes) -> dict | None:
        """The first raw frame once ``chunk`` completes it, else None: a join read by a reader of many links."""
        self._buffer += chunk
        if b"\n" not in self._buffer:
            if len(self._buffer) > wire.MAX_FRAME:
                raise wire.FrameError(f"frame longer than {wire.MAX_FRAME} bytes")
            return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return wire.decode(line + b"\n")

    def frames(self, chunk: bytes) -> Iterator[dict]:
        """The signed messages that ``chunk`` completes, in order: for a reader that waits on many links at once."""
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            yield self._open(wire.decode(line + b"\n"))
        if len(self._buffer) > wire.MAX_FRAME:
            raise wire.FrameError(f"frame longer than {wire.MAX_FRAME} bytes")

    def _open(self, frame: dict) -> dict:
        message = wire.open_signed(self.key, self._recv_seq + 1, frame)
        self._recv_seq += 1
        return message

    def close(self) -> None:
        for closer in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                closer()
            except OSError:
                pass


class Refused(Exception):
    """The join was refused; the message says why (one line), ``kind`` the same without what the peer chose."""

    def __init__(self, reason: str, kind: str | None = None):
        super().__init__(reason)
        self.kind = kind


def reject(link: Link, reason: str) -> None:
    try:
        link.send_raw({"t": "reject", "reason": reason})
    except OSError:
        pass


def close_quietly(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def start_thread(target, name: str, *args) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, args=args, daemon=True)
    thread.start()
    return thread


def listen(bind: str, port: int, hosts: int, log: Callable[[str], None]) -> socket.socket:
    """The lead's listening socket for a job of ``hosts`` hosts (its open-files limit raised for them)."""
    needed = open_files_needed(hosts)  # a socket per host here, an ssh session per host in mpirun
    soft, hard = raise_open_files(needed)
    if soft < needed:
        log(f"control channel: {hosts} hosts need about {needed} open files, and the hard "
            f"limit is {hard} (ulimit -Hn): hosts past it may not join")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError as exc:
        sock.close()
        raise ClusterError(f"control channel: cannot listen on port {port}: {exc.strerror or exc}") from None
    sock.listen(max(1024, (hosts - 1) * 2))  # a flood must not fill it: a dropped SYN costs a joining host 1 s
    return sock
