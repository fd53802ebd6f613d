"""The job's control channel: the first host serves, the others join.

It gives every runner three things: a readiness barrier with a deadline that
names the hosts that never came, a way for any host to report a failure, and
the job's verdict sent from the first host to all the others, so that every
host ends within a second of the job, and within seconds of any failure.

The wire format and its keys are in ``wire``; who may join is decided by
``admission`` (by the job's secret, or by address where the platform gives
none).  A join carries each host's introduction (e.g. its ssh host key) and
the first host's answer (the job's id, the client key), so a job needs no
shared secret to set up ssh.  Both sides send a heartbeat every
``heartbeat_s``; silence for ``timeout_s`` (or a closed connection) means the
peer is gone.  See docs/security.md for what this stops and what it does not.
"""

from __future__ import annotations

import math
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from queue import SimpleQueue

from training_toolkit import settings
from training_toolkit.cluster import wire
from training_toolkit.cluster.admission import Admission, RefusalLog
from training_toolkit.errors import EXIT_CLUSTER_ERROR, ClusterError, JobFailed

# The defaults are the settings' (TRAINING_TOOLKIT_HEARTBEAT, TRAINING_TOOLKIT_PEER_TIMEOUT): one table.
HEARTBEAT_S: float = settings.default("heartbeat_s")
TIMEOUT_S: float = settings.default("peer_timeout_s")
# A failure report's own time is believed within this much before its arrival (clocks differ; a report
# is sent within a second of the failure), and never after its arrival.
MAX_REPORT_AGE_S = 10.0
HANDSHAKE_TIMEOUT_S = 5.0  # from accept to a seated host; a join that takes longer is dropped


def log_line(message: str) -> None:
    sys.stderr.write(f"training-toolkit: {message}\n")
    sys.stderr.flush()


# Events the channel posts to the runner's queue ----------------------------------------------
# ``at``: the wall clock (time.time()) when it happened, as the failed host says (a failure), or
# when this host learnt of it; it orders failures (decisions.root_cause), it is not the event's identity.


@dataclass(frozen=True)
class PeerFailed:
    host: str
    reason: str
    exit_code: int
    at: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PeerDone:
    host: str
    exit_code: int
    at: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PeerLost:
    host: str
    reason: str
    at: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Verdict:
    """The job's end, as decided by the first host."""

    exit_code: int
    reason: str | None = None
    host: str | None = None


# One connection ----------------------------------------------------------------------------------


class _Link:
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

    def recv_raw(self, deadline: float | None = None) -> dict:
        """The next frame; by ``deadline`` (monotonic) if given, else within the socket's own timeout."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > wire.MAX_FRAME:
                raise wire.FrameError(f"frame longer than {wire.MAX_FRAME} bytes")
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
        return wire.decode(line + b"\n")

    def send(self, kind: str, **fields) -> None:
        with self._send_lock:
            self._send_seq += 1
            self.sock.sendall(wire.sign(self.key, self._send_seq, kind, fields))

    def recv(self) -> dict:
        message = wire.open_signed(self.key, self._recv_seq + 1, self.recv_raw())
        self._recv_seq += 1
        return message

    def close(self) -> None:
        for closer in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                closer()
            except OSError:
                pass


class _Refused(Exception):
    """The join was refused; the message says why (one line)."""


# The first host ---------------------------------------------------------------------------------


class ControlServer:
    """Serves the channel on the first host; ``expected`` are the other hosts.

    ``secret`` is the platform's job secret, or None: then seats are admitted
    by address (``admission``).  ``job_id`` and ``introduction`` go to every
    host in its welcome; each host's own introduction is kept in ``introductions``.
    """

    def __init__(
        self,
        secret: bytes | None,
        expected: Sequence[str],
        port: int,
        events: SimpleQueue,
        *,
        job_id: str = "",
        introduction: Mapping[str, str] | None = None,
        bind: str = "",
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = TIMEOUT_S,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        admission: Admission | None = None,
        log: Callable[[str], None] = log_line,
    ):
        self._secret = secret
        self.expected = tuple(expected)
        self.port = port
        self.job_id = job_id
        self._introduction = dict(introduction or {})
        self._events = events
        self._bind = bind
        self._heartbeat_s = heartbeat_s
        self._timeout_s = timeout_s
        self._handshake_timeout_s = handshake_timeout_s
        self._admission = admission or Admission(self.expected, by_address=secret is None)
        self._refusals = RefusalLog(log)
        self.introductions: dict[str, dict[str, str]] = {}
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
        sock.listen(max(128, len(self.expected) * 2))
        self._sock = sock
        _thread(self._accept_loop, "control-accept")
        _thread(self._heartbeat_loop, "control-heartbeat")

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.01)  # out of file descriptors under a flood: let some close
                continue
            address = str(addr[0])
            refusal = self._admission.enter(address)
            if refusal is not None:
                self._refusals.refused(address, refusal)
                _close(conn)
                continue
            try:
                _thread(self._serve, f"control-{address}", conn, address)
            except RuntimeError:  # no thread to be had: drop this one, the others go on
                self._admission.done(address)
                _close(conn)

    def _serve(self, conn: socket.socket, address: str) -> None:
        link = _Link(conn, address)
        try:
            host = self._admit(link, address)
        finally:
            self._admission.done(address)
        if host is None:
            link.close()
            return
        conn.settimeout(self._timeout_s)
        try:
            while not self._closed.is_set():
                self._on_message(host, link.recv())
        except (OSError, ValueError, ConnectionError) as exc:
            if not self._closed.is_set():
                reason = "timed out" if isinstance(exc, socket.timeout) else str(exc) or type(exc).__name__
                self._lost(host, link, reason)

    def _admit(self, link: _Link, address: str) -> str | None:
        """The host that joined on ``link``, or None (refused, with one log line)."""
        try:
            refusal = self._admission.check_peer(address)
            if refusal is not None:
                raise _Refused(refusal)
            link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return self._handshake(link, address, time.monotonic() + self._handshake_timeout_s)
        except _Refused as exc:
            self._refusals.refused(address, str(exc))
        except socket.timeout:
            self._refusals.refused(address, f"no complete join within {self._handshake_timeout_s:g} s")
        except (OSError, ValueError, ConnectionError) as exc:
            self._refusals.refused(address, str(exc) or type(exc).__name__)
        return None

    def _handshake(self, link: _Link, address: str, deadline: float) -> str:
        exchange, server_nonce = wire.KeyExchange(), wire.nonce()
        link.send_raw({"t": "challenge", "v": wire.PROTOCOL, "nonce": server_nonce, "kx": exchange.public})
        hello = link.recv_raw(deadline)
        if hello.get("t") != "hello":
            raise wire.FrameError("expected a hello")
        host = wire.text(hello, "host", limit=255)
        client_nonce = hello.get("nonce")
        if not wire.is_nonce(client_nonce):
            raise wire.FrameError("field 'nonce' is not a nonce")
        introduction = wire.introduction(hello)
        keys = exchange.keys(hello.get("kx"), self._secret,
                             wire.transcript(server_nonce, client_nonce, exchange.public, str(hello.get("kx")), host))
        if not wire.verify(keys.auth, hello.get("mac"), "hello", wire.canonical(introduction)):
            _reject(link, "authentication failed")
            raise _Refused(f"{host!r} failed authentication" + (" (a different job secret?)" if self._secret else ""))
        with self._state:
            reason = self._admission.seat(host, address, seated=[*self._links, *self._joining])
            if reason is None:
                self._joining.add(host)
        if reason is not None:
            _reject(link, reason)
            raise _Refused(reason)
        try:
            link.send_raw({"t": "welcome", "job": self.job_id, "intro": self._introduction,
                           "mac": wire.mac(keys.auth, "welcome", self.job_id, wire.canonical(self._introduction))})
            link.key = keys.session
        finally:
            # Seated only once it can sign: a broadcast never reaches a half-joined link.
            with self._state:
                self._joining.discard(host)
                self._links[host] = link
                self.introductions[host] = introduction
                verdict = self._verdict
        if verdict is not None:  # a late joiner learns at once that the job is over
            link.send("verdict", code=verdict.exit_code, reason=verdict.reason, host=verdict.host)
        with self._state:  # counted as joined only now, so `linger` never closes before the verdict is out
            self._joined.add(host)
            self._state.notify_all()
        return host

    def _on_message(self, host: str, message: dict) -> None:
        kind = message["t"]
        if kind == "ready":
            with self._state:
                self._ready.add(host)
                self._state.notify_all()
        elif kind == "failed":
            reason, code = wire.text(message, "reason") or "failed", wire.exit_code(message)
            at = reported_time(message.get("at"), time.time())
            named = reason if reason.startswith(f"{host}:") else f"{host}: {reason}"
            with self._state:
                self._failure = self._failure or JobFailed(named, code)
                self._state.notify_all()
            self._events.put(PeerFailed(host, reason, code, at))
        elif kind == "done":
            self._events.put(PeerDone(host, wire.exit_code(message), time.time()))

    def _lost(self, host: str, link: _Link, reason: str) -> None:
        link.close()
        with self._state:
            if self._links.get(host) is link:
                del self._links[host]
            self._failure = self._failure or JobFailed(f"{host}: left the job ({reason})", EXIT_CLUSTER_ERROR)
            self._state.notify_all()
        self._events.put(PeerLost(host, reason, time.time()))

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
            _close(self._sock)
        with self._state:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            link.close()
        self._refusals.summary()


# The other hosts --------------------------------------------------------------------------------


class ControlClient:
    """Joins the channel of the first host (``master``) as ``host``, telling it ``introduction``.

    After ``connect``: ``job_id`` and the first host's ``introduction`` are
    what its welcome carried.
    """

    def __init__(
        self,
        secret: bytes | None,
        host: str,
        master: str,
        port: int,
        events: SimpleQueue,
        *,
        introduction: Mapping[str, str] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = TIMEOUT_S,
    ):
        self._secret = secret
        self.host = host
        self.master = master
        self.port = port
        self._introduction = dict(introduction or {})
        self._events = events
        self._heartbeat_s = heartbeat_s
        self._timeout_s = timeout_s
        self._link: _Link | None = None
        self.job_id = ""
        self.introduction: dict[str, str] = {}
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
            except _Refused as exc:
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
        deadline = time.monotonic() + timeout
        sock = socket.create_connection((self.master, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(sock, self.master)
        try:
            challenge = link.recv_raw(deadline)
            server_nonce = challenge.get("nonce")
            if challenge.get("t") != "challenge" or challenge.get("v") != wire.PROTOCOL or not wire.is_nonce(server_nonce):
                raise _Refused(f"not a training-toolkit control channel of protocol {wire.PROTOCOL}")
            exchange, client_nonce = wire.KeyExchange(), wire.nonce()
            keys = exchange.keys(challenge.get("kx"), self._secret,
                                 wire.transcript(server_nonce, client_nonce, str(challenge.get("kx")), exchange.public, self.host))
            link.send_raw({"t": "hello", "host": self.host, "nonce": client_nonce, "kx": exchange.public,
                           "intro": self._introduction,
                           "mac": wire.mac(keys.auth, "hello", wire.canonical(self._introduction))})
            answer = link.recv_raw(deadline)
            if answer.get("t") == "reject":
                raise _Refused(wire.text(answer, "reason", optional=True) or "rejected")
            job_id = wire.text(answer, "job", limit=64) if answer.get("t") == "welcome" else ""
            introduction = wire.introduction(answer)
            if answer.get("t") != "welcome" or not wire.verify(keys.auth, answer.get("mac"), "welcome", job_id or "",
                                                               wire.canonical(introduction)):
                raise _Refused("the first host failed authentication (a different job secret?)")
        except BaseException:
            link.close()
            raise
        link.key = keys.session
        self.job_id, self.introduction = job_id or "", introduction
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
                    verdict = Verdict(wire.exit_code(message), wire.text(message, "reason", optional=True),
                                      wire.text(message, "host", limit=255, optional=True))
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
        self._events.put(ending if isinstance(ending, Verdict) else PeerLost(self.master, ending, time.time()))

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

    def failed(self, reason: str, exit_code: int, at: float | None = None) -> None:
        """Report this host's failure, and when it happened (wall clock; None: now)."""
        self._send("failed", reason=reason, code=exit_code, at=time.time() if at is None else at)

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


def reported_time(value: object, received: float) -> float:
    """When a reported failure happened: the report's own time, within ``MAX_REPORT_AGE_S`` before its arrival.

    A report without a usable time (another toolkit version) counts as happening when it arrived.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return received
    return min(received, max(float(value), received - MAX_REPORT_AGE_S))


def _reject(link: _Link, reason: str) -> None:
    try:
        link.send_raw({"t": "reject", "reason": reason})
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _thread(target, name: str, *args) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, args=args, daemon=True)
    thread.start()
    return thread
