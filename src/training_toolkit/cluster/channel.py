"""The job's control channel: the first host serves, the others join.

It gives every runner three things: a readiness barrier with a deadline that
names the hosts that never came, a way for any host to report a failure, and
the job's verdict sent from the first host to all the others, so that every
host ends within a second of the job, and within seconds of any failure.

Wire format: one JSON object per line over TCP.  A join starts with a mutual
HMAC challenge-response on the job secret (both sides prove they know it,
without sending it); every later message carries a sequence number and an HMAC
under a per-connection session key, so messages can be neither forged nor
replayed.  Both sides send a heartbeat every ``heartbeat_s``; silence for
``timeout_s`` (or a closed connection) means the peer is gone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from queue import SimpleQueue

from training_toolkit.errors import EXIT_CLUSTER_ERROR, ClusterError, JobFailed

PROTOCOL = 1
DEFAULT_PORT = 8950
HEARTBEAT_S = 1.0
TIMEOUT_S = 10.0
MAX_LINE = 64 * 1024


# Events the channel posts to the runner's queue ----------------------------------------------


@dataclass(frozen=True)
class PeerFailed:
    host: str
    reason: str
    exit_code: int


@dataclass(frozen=True)
class PeerDone:
    host: str
    exit_code: int


@dataclass(frozen=True)
class PeerLost:
    host: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    """The job's end, as decided by the first host."""

    exit_code: int
    reason: str | None = None
    host: str | None = None


# Framing and authentication -----------------------------------------------------------------


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


class _Link:
    """One authenticated connection: signed, sequenced JSON lines in both directions."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock = sock
        self.peer = peer
        self.reader = sock.makefile("rb")
        self.key = b""
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()
        self.last_heard = time.monotonic()

    def send_raw(self, message: dict) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._send_lock:
            self.sock.sendall(data)

    def recv_raw(self) -> dict:
        line = self.reader.readline(MAX_LINE + 1)
        if not line:
            raise ConnectionError("connection closed")
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise ConnectionError("message too long")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ConnectionError("malformed message")
        self.last_heard = time.monotonic()
        return message

    def send(self, kind: str, **fields) -> None:
        with self._send_lock:
            self._send_seq += 1
            body = {"t": kind, "seq": self._send_seq, **fields}
            body["mac"] = _mac(self.key, json.dumps(body, sort_keys=True))
            self.sock.sendall((json.dumps(body, separators=(",", ":")) + "\n").encode())

    def recv(self) -> dict:
        message = self.recv_raw()
        mac = message.pop("mac", "")
        if not hmac.compare_digest(str(mac), _mac(self.key, json.dumps(message, sort_keys=True))):
            raise ConnectionError("message failed authentication")
        if message.get("seq") != self._recv_seq + 1:
            raise ConnectionError("message out of sequence (replayed?)")
        self._recv_seq += 1
        return message

    def close(self) -> None:
        for closer in (self.reader.close, lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                closer()
            except OSError:
                pass


# The first host ---------------------------------------------------------------------------------


class ControlServer:
    """Serves the channel on the first host; ``expected`` are the other hosts."""

    def __init__(
        self,
        secret: bytes,
        expected: Sequence[str],
        port: int,
        events: SimpleQueue,
        *,
        bind: str = "",
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = TIMEOUT_S,
    ):
        self._secret = secret
        self.expected = tuple(expected)
        self.port = port
        self._events = events
        self._bind = bind
        self._heartbeat_s = heartbeat_s
        self._timeout_s = timeout_s
        self._links: dict[str, _Link] = {}
        self._joining: set[str] = set()  # in the handshake: the seat is taken, the link cannot sign yet
        self._joined: set[str] = set()  # every host that ever joined (lost ones included)
        self._verdict: Verdict | None = None
        self._ready: set[str] = set()
        self._failure: JobFailed | None = None
        self._state = threading.Condition()
        self._closed = threading.Event()
        self._sock: socket.socket | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._bind, self.port))
        except OSError as exc:
            sock.close()
            raise ClusterError(f"control channel: cannot listen on port {self.port}: {exc.strerror or exc}") from None
        sock.listen(max(16, len(self.expected) * 2))
        self._sock = sock
        _thread(self._accept_loop, "control-accept")
        _thread(self._heartbeat_loop, "control-heartbeat")

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return
            _thread(self._serve, f"control-{addr[0]}", conn, addr[0])

    def _serve(self, conn: socket.socket, address: str) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(self._timeout_s)
        link = _Link(conn, address)
        try:
            host = self._handshake(link)
        except (OSError, ValueError, ConnectionError):
            link.close()
            return
        try:
            while not self._closed.is_set():
                message = link.recv()
                self._on_message(host, message)
        except (OSError, ValueError, ConnectionError) as exc:
            if not self._closed.is_set():
                reason = "timed out" if isinstance(exc, socket.timeout) else str(exc) or type(exc).__name__
                self._lost(host, link, reason)

    def _handshake(self, link: _Link) -> str:
        nonce = secrets.token_hex(16)
        link.send_raw({"t": "challenge", "v": PROTOCOL, "nonce": nonce})
        hello = link.recv_raw()
        host, cnonce = str(hello.get("host", "")), str(hello.get("nonce", ""))
        expected_mac = _mac(self._secret, "hello", nonce, cnonce, host)
        if hello.get("t") != "hello" or not hmac.compare_digest(str(hello.get("mac", "")), expected_mac):
            link.send_raw({"t": "reject", "reason": "authentication failed"})
            raise ConnectionError("authentication failed")
        with self._state:
            if host not in self.expected:
                reason = f"{host!r} is not a host of this job"
            elif host in self._links or host in self._joining:
                reason = f"{host!r} has joined already"
            else:
                reason = None
                self._joining.add(host)
        if reason:
            link.send_raw({"t": "reject", "reason": reason})
            raise ConnectionError(reason)
        try:
            link.send_raw({"t": "welcome", "mac": _mac(self._secret, "welcome", nonce, cnonce, host)})
            link.key = hmac.new(self._secret, f"session|{nonce}|{cnonce}".encode(), hashlib.sha256).digest()
        finally:
            # Seated only once it can sign: a broadcast never reaches a half-joined link.
            with self._state:
                self._joining.discard(host)
                self._links[host] = link
                verdict = self._verdict
        if verdict is not None:  # a late joiner learns at once that the job is over
            link.send("verdict", code=verdict.exit_code, reason=verdict.reason, host=verdict.host)
        with self._state:  # counted as joined only now, so `linger` never closes before the verdict is out
            self._joined.add(host)
            self._state.notify_all()
        return host

    def _on_message(self, host: str, message: dict) -> None:
        kind = message.get("t")
        if kind == "ready":
            with self._state:
                self._ready.add(host)
                self._state.notify_all()
        elif kind == "failed":
            reason = str(message.get("reason", "failed"))
            named = reason if reason.startswith(f"{host}:") else f"{host}: {reason}"
            code = int(message.get("code", 1))
            with self._state:
                self._failure = self._failure or JobFailed(named, code)
                self._state.notify_all()
            self._events.put(PeerFailed(host, reason, code))
        elif kind == "done":
            self._events.put(PeerDone(host, int(message.get("code", 0))))

    def _lost(self, host: str, link: _Link, reason: str) -> None:
        link.close()
        with self._state:
            if self._links.get(host) is link:
                del self._links[host]
            self._failure = self._failure or JobFailed(f"{host}: left the job ({reason})", EXIT_CLUSTER_ERROR)
            self._state.notify_all()
        self._events.put(PeerLost(host, reason))

    def _heartbeat_loop(self) -> None:
        while not self._closed.wait(self._heartbeat_s):
            with self._state:
                links = list(self._links.values())
            for link in links:
                try:
                    link.send("ping")
                except OSError:
                    pass

    def wait_ready(self, deadline_s: float) -> None:
        """Block until every expected host is ready; name the ones that are not at the deadline."""
        end = time.monotonic() + deadline_s
        with self._state:
            while True:
                if self._failure:
                    raise self._failure
                missing = [h for h in self.expected if h not in self._ready]
                if not missing:
                    return
                left = end - time.monotonic()
                if left <= 0:
                    joined = [h for h in missing if h in self._links]
                    absent = [h for h in missing if h not in self._links]
                    parts = []
                    if absent:
                        parts.append(f"never joined: {', '.join(absent)}")
                    if joined:
                        parts.append(f"joined but never ready: {', '.join(joined)}")
                    raise ClusterError(f"hosts not ready within {deadline_s:g} s ({'; '.join(parts)})")
                self._state.wait(min(left, 1.0))

    def release(self) -> None:
        self._send_all("go")

    def broadcast(self, verdict: Verdict) -> None:
        with self._state:
            self._verdict = verdict
        self._send_all("verdict", code=verdict.exit_code, reason=verdict.reason, host=verdict.host)

    def linger(self, timeout_s: float) -> None:
        """After the verdict: give hosts that have not joined yet up to ``timeout_s`` to come and hear it."""
        end = time.monotonic() + timeout_s
        with self._state:
            while not set(self.expected) <= self._joined:
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._state.wait(min(left, 0.5))

    def _send_all(self, kind: str, **fields) -> None:
        with self._state:
            links = list(self._links.values())
        for link in links:
            try:
                link.send(kind, **fields)
            except OSError:
                pass

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        with self._state:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            link.close()


# The other hosts --------------------------------------------------------------------------------


class ControlClient:
    """Joins the channel of the first host (``master``) as ``host``."""

    def __init__(
        self,
        secret: bytes,
        host: str,
        master: str,
        port: int,
        events: SimpleQueue,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = TIMEOUT_S,
    ):
        self._secret = secret
        self.host = host
        self.master = master
        self.port = port
        self._events = events
        self._heartbeat_s = heartbeat_s
        self._timeout_s = timeout_s
        self._link: _Link | None = None
        self._go = threading.Event()
        self._ended: Verdict | str | None = None
        self._state = threading.Condition()
        self._closed = threading.Event()

    def connect(self, deadline_s: float) -> None:
        """Join, retrying until the deadline: the first host may start after us."""
        end = time.monotonic() + deadline_s
        delay = 0.05
        last = "no attempt"
        while True:
            try:
                self._join(min(5.0, max(0.5, end - time.monotonic())))
                return
            except _Rejected as exc:
                raise ClusterError(f"control channel on {self.master}:{self.port} refused {self.host}: {exc}") from None
            except (OSError, ValueError, ConnectionError) as exc:
                last = str(exc) or type(exc).__name__
            if time.monotonic() + delay >= end:
                raise ClusterError(
                    f"could not reach the control channel on {self.master}:{self.port} within {deadline_s:g} s: {last}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _join(self, timeout: float) -> None:
        sock = socket.create_connection((self.master, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(sock, self.master)
        try:
            challenge = link.recv_raw()
            if challenge.get("t") != "challenge" or challenge.get("v") != PROTOCOL:
                raise ConnectionError("not a training-toolkit control channel")
            nonce, cnonce = str(challenge.get("nonce", "")), secrets.token_hex(16)
            link.send_raw({"t": "hello", "host": self.host, "nonce": cnonce,
                           "mac": _mac(self._secret, "hello", nonce, cnonce, self.host)})
            answer = link.recv_raw()
            if answer.get("t") == "reject":
                raise _Rejected(str(answer.get("reason", "rejected")))
            expected = _mac(self._secret, "welcome", nonce, cnonce, self.host)
            if answer.get("t") != "welcome" or not hmac.compare_digest(str(answer.get("mac", "")), expected):
                raise _Rejected("the server failed authentication (a different job secret?)")
        except BaseException:
            link.close()
            raise
        link.key = hmac.new(self._secret, f"session|{nonce}|{cnonce}".encode(), hashlib.sha256).digest()
        sock.settimeout(self._timeout_s)
        self._link = link
        _thread(self._read_loop, "control-read")
        _thread(self._heartbeat_loop, "control-heartbeat")

    def _read_loop(self) -> None:
        assert self._link is not None
        try:
            while True:
                message = self._link.recv()
                kind = message.get("t")
                if kind == "go":
                    self._go.set()
                    with self._state:
                        self._state.notify_all()
                elif kind == "verdict":
                    verdict = Verdict(int(message.get("code", 1)), message.get("reason"), message.get("host"))
                    self._end(verdict)
                    return
        except (OSError, ValueError, ConnectionError) as exc:
            if not self._closed.is_set():
                reason = "timed out" if isinstance(exc, socket.timeout) else str(exc) or type(exc).__name__
                self._end(f"lost the first host {self.master} ({reason})")

    def _end(self, ending: Verdict | str) -> None:
        with self._state:
            if self._ended is not None:
                return
            self._ended = ending
            self._state.notify_all()
        self._events.put(ending if isinstance(ending, Verdict) else PeerLost(self.master, ending))

    def _heartbeat_loop(self) -> None:
        while not self._closed.wait(self._heartbeat_s):
            self._send("ping")

    def _send(self, kind: str, **fields) -> None:
        if self._link is None:
            return
        try:
            self._link.send(kind, **fields)
        except OSError:
            pass

    def ready(self) -> None:
        self._send("ready")

    def failed(self, reason: str, exit_code: int) -> None:
        self._send("failed", reason=reason, code=exit_code)

    def done(self, exit_code: int) -> None:
        self._send("done", code=exit_code)

    def wait_go(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        with self._state:
            while not self._go.is_set():
                if isinstance(self._ended, Verdict):
                    verdict = self._ended
                    raise JobFailed(verdict.reason or f"the job ended with code {verdict.exit_code}", verdict.exit_code)
                if isinstance(self._ended, str):
                    raise ClusterError(self._ended)
                left = end - time.monotonic()
                if left <= 0:
                    raise ClusterError(f"the first host {self.master} did not start the job within {deadline_s:g} s")
                self._state.wait(min(left, 1.0))

    def close(self) -> None:
        self._closed.set()
        if self._link is not None:
            self._link.close()


class _Rejected(Exception):
    pass


def _thread(target, name: str, *args) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, args=args, daemon=True)
    thread.start()
    return thread
