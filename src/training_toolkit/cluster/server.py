"""The control channel's the lead: admits the others, hears them, sends the go, restarts and the verdict.

It decides nothing: every join, readiness, loss (with its reason) and failure report is posted to the agent's
event queue (``cluster.events``); who is missing at a barrier, and which failure is the root cause, is the
agent's pure decision (``agent.barrier``, ``agent.failures``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from queue import SimpleQueue

from training_toolkit.cluster import wire
from training_toolkit.cluster.admission import Admission, RefusalLog, may_retake
from training_toolkit.cluster.events import (PeerDone, PeerFailed, PeerJoined, PeerLost, PeerProgress, PeerReady,
                                             Verdict, reported_time)
from training_toolkit.cluster.link import Link, Refused, close_quietly, listen, reject, start_thread
from training_toolkit.cluster.reader import LinkReader
from training_toolkit.cluster.timing import HANDSHAKE_TIMEOUT_S, HEARTBEAT_S, TIMEOUT_S
from training_toolkit.core.log import log as log_line
from training_toolkit.job.attempt import Attempt


class ControlServer:
    """Serves the channel on the lead; ``expected`` are the followers.

    ``secret`` is the platform's job secret, or None: then seats are admitted
    by address (``admission``).  ``first_attempt``: the attempt the job starts at
    (the platform restarted the whole job: JobSet's restart-attempt).  ``job_id``, ``introduction`` and ``hosts``
    (the job's hosts in rank order, this one first: the membership every host takes, never guesses) go to every
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
        first_attempt: int = 0,
        hosts: Sequence[str] = (),
    ):
        self._secret = secret
        self.hosts = tuple(hosts)
        self.expected = tuple(expected)
        self.port = port
        self.job_id = job_id
        self._introduction = dict(introduction or {})
        self._events = events
        self._bind = bind
        # Its own heartbeats only need to keep each host from hearing nothing for ``timeout_s``: a quarter of
        # it is ample, and at 1,000 hosts each send costs (docs/scale.md). The hosts' own stay at ``heartbeat_s``.
        self._heartbeat_s = max(heartbeat_s, timeout_s / 4)
        self._timeout_s = timeout_s
        self._handshake_timeout_s = handshake_timeout_s
        self._admission = admission or Admission(self.expected, by_address=secret is None)
        self._log = log
        self._refusals = RefusalLog(log)
        self.introductions: dict[str, dict[str, str]] = {}
        self._links: dict[str, Link] = {}
        self._joining: set[str] = set()  # in the handshake: the seat is taken, the link cannot sign yet
        self._joined: set[str] = set()  # every host that ever joined (lost ones included)
        self._verdict: Verdict | None = None
        self._ready: dict[str, int] = {}  # the last attempt each host said it is ready for (a stale seat's test)
        self._attempt = first_attempt  # the job's attempt, as the welcome tells it
        self._released = -1  # the last attempt whose processes were started (its go sent)
        self._stacks: dict[str, object] = {}  # answers to the last request for stacks, by host
        self._state = threading.Condition()
        self._closed = threading.Event()
        self._sock: socket.socket | None = None
        self._reader = LinkReader(self._on_message, self._lost, timeout_s)

    def start(self) -> None:
        self._sock = listen(self._bind, self.port, len(self.expected) + 1, self._log)
        self._reader.start()
        start_thread(self._accept_loop, "control-accept")
        start_thread(self._heartbeat_loop, "control-heartbeat")

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
                close_quietly(conn)
                continue
            self._begin(conn, address)

    def _begin(self, conn: socket.socket, address: str) -> None:
        """On the accept thread: check the address, send the challenge; the reader waits for the hello."""
        link = Link(conn, address)
        deadline = time.monotonic() + self._handshake_timeout_s  # from accept, the address check included
        try:
            refusal = self._admission.check_peer(address)
            if refusal is not None:
                raise Refused(refusal)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self._timeout_s)  # bounds a send to a host that stopped reading
            exchange, server_nonce = wire.KeyExchange(), wire.nonce()
            link.send_raw({"t": "challenge", "v": wire.PROTOCOL, "nonce": server_nonce, "kx": exchange.public})
        except Refused as exc:
            self._join_failed(link, address, str(exc), exc.kind)
            return
        except OSError as exc:
            self._join_failed(link, address, str(exc) or type(exc).__name__, type(exc).__name__)
            return

        late = f"no complete join within {self._handshake_timeout_s:g} s"
        self._reader.join(link, deadline, lambda hello: self._hello(link, address, exchange, server_nonce, hello),
                          lambda reason: self._join_failed(link, address, late if reason == "deadline" else reason))

    def _join_failed(self, link: Link, address: str, reason: str, kind: str | None = None) -> None:
        """A join that ends without a seat: one log line (per address and kind of refusal), its slot freed, closed.

        ``kind`` leaves out what the peer chose (a name it claimed, the text of an error that may quote its bytes).
        """
        self._refusals.refused(address, reason, kind)
        self._admission.done(address)
        link.close()

    def _hello(self, link: Link, address: str, exchange: wire.KeyExchange, server_nonce: str, hello: dict) -> str | None:
        """On the reader: the rest of the join; the host now seated on ``link``, or None (refused, closed)."""
        try:
            host = self._handshake(link, address, exchange, server_nonce, hello)
        except Refused as exc:
            self._join_failed(link, address, str(exc), exc.kind)
            return None
        except (OSError, ValueError, ConnectionError) as exc:  # the text may quote what the peer sent
            self._join_failed(link, address, str(exc) or type(exc).__name__, type(exc).__name__)
            return None
        self._admission.done(address)
        return host

    def _handshake(self, link: Link, address: str, exchange: wire.KeyExchange, server_nonce: str, hello: dict) -> str:
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
            reject(link, "authentication failed")
            # The reason leaves out the name the peer sent: refusals are logged once per (address, reason).
            raise Refused("failed authentication" + (" (a different job secret?)" if self._secret else ""))
        with self._state:  # the seat it may take again (``admission.may_retake``): its link
            stale = self._links.get(host)
            if stale is None or not may_retake(stale.peer, address, self._ready.get(host, -1), self._attempt):
                stale = None
            seated = [h for h in [*self._links, *self._joining] if h != host or stale is None]
            reason = "the job is over" if self._closed.is_set() else self._admission.seat(host, address, seated=seated)
            if reason is None:
                self._joining.add(host)
                kept = {host: self.introductions[host]} if host in self.introductions else {}  # its last seat's
        if reason is not None:
            reject(link, reason)  # the peer is told the name it claimed; the log counts it once per address
            raise Refused(reason, kind=reason.replace(repr(host), "<the name it claimed>"))
        try:
            # Under one lock, the welcome tells where the job is and the host is seated: a restart or a go comes
            # before (the welcome says so) or after (broadcast to this link); close() sets its flag, then closes
            # the links seated (under this lock): welcomed and seated in one hold, or neither.  Its introduction is
            # stored before the welcome goes: a host that heard it may be asked about at once (readers take no lock).
            with self._state:
                self._joining.discard(host)
                over = self._closed.is_set()
                if not over:
                    at = {"n": self._attempt, "go": self._released == self._attempt}  # where a rejoining host comes in
                    self.introductions[host] = introduction
                    link.send_raw(wire.welcome(keys.auth, self.job_id, self._introduction, at, list(self.hosts)))
                    link.key = keys.session  # seated only once it can sign: a broadcast never reaches a half-joined link
                    stale = self._links.get(host)
                    self._links[host] = link
                    verdict = self._verdict
        except BaseException:
            with self._state:  # not seated: the host may try again; its last seat's introduction stands
                self._joining.discard(host)
                self.introductions.pop(host, None)
                self.introductions.update(kept)
            raise
        if over:
            raise Refused("the job is over")
        if verdict is not None:  # a late joiner learns at once that the job is over
            link.send("verdict", code=verdict.exit_code, reason=verdict.reason, host=verdict.host,
                      summary=verdict.summary)
        with self._state:  # counted as joined only now, so `linger` never closes before the verdict is out
            self._joined.add(host)
            self._state.notify_all()
        self._events.put(PeerJoined(host))
        if stale is not None:
            self._reader.give_up(stale)  # no loss: it is no longer the host's link
        return host

    def _on_message(self, host: str, message: dict) -> None:
        kind = message["t"]
        attempt = wire.attempt(message)
        if kind == "ready":
            with self._state:
                if attempt >= self._attempt:  # a host that rejoined may be ready for a restart not yet called
                    self._ready[host] = attempt
            self._events.put(PeerReady(host, attempt))
        elif kind == "failed":
            reason, code = wire.text(message, "reason") or "failed", wire.exit_code(message)
            at = reported_time(message.get("at"), time.time())
            self._events.put(PeerFailed(host, reason, code, at, attempt, message.get("stop") is True))
        elif kind == "done":
            self._events.put(PeerDone(host, wire.exit_code(message), time.time()))
        elif kind == "progress":
            self._events.put(PeerProgress(host, message.get("hb") is True, message.get("ck") is True))
        elif kind == "stacks":
            with self._state:
                self._stacks[host] = message.get("stacks")
                self._state.notify_all()

    def _lost(self, host: str, link: Link, reason: str) -> None:
        link.close()
        with self._state:
            if self._closed.is_set() or self._links.get(host) not in (link, None):
                return  # the job is over, or the seat was taken again (a stale seat retaken): no loss
            self._links.pop(host, None)
            self._state.notify_all()
        self._events.put(PeerLost(host, reason, time.time()))

    def _heartbeat_loop(self) -> None:
        while not self._closed.wait(self._heartbeat_s):
            self._send_all("ping")

    def release(self, attempt: Attempt | None = None) -> None:
        """Start the attempt: every host hears ``attempt`` (None: every host of the job active), its number the channel's."""
        with self._state:  # and every seated host's introduction (MPI's keys for tree spawn), encoded once for all
            self._released, intros = self._attempt, dict(self.introductions)  # each host's is replaced, never changed
        fields = {"intros": intros, **wire.seats(attempt or Attempt(self._attempt, self.hosts))}
        self._send_all("go", wire.shared_fields(fields), n=self._attempt)

    def restart(self, attempt: int, reason: str, cause: str | None = None) -> None:
        """Every host: stop your part, and meet at the barrier of ``attempt`` (readies and failures start afresh)."""
        with self._state:
            self._attempt = attempt
        self._send_all("restart", n=attempt, reason=reason[:wire.MAX_TEXT], cause=cause)

    def mark(self, host: str, attempt: int) -> None:
        """Every host: a checkpoint was marked on ``host`` in ``attempt``, now by this clock (``host`` ignores it)."""
        self._send_all("mark", host=host, n=attempt, at=time.time())

    def request_stacks(self, timeout_s: float) -> dict[str, object]:
        """Ask every joined host for its ranks' stacks; what came within ``timeout_s``, by host (unchecked)."""
        end = time.monotonic() + timeout_s
        with self._state:
            self._stacks = {}
            asked = set(self._links)
        self._send_all("stacks?")
        with self._state:
            while not asked <= set(self._stacks):
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._state.wait(min(left, 0.5))
            return dict(self._stacks)

    def broadcast(self, verdict: Verdict) -> None:
        with self._state:
            self._verdict = verdict
        self._send_all("verdict", code=verdict.exit_code, reason=verdict.reason, host=verdict.host,
                       summary=verdict.summary)

    def linger(self, timeout_s: float) -> None:
        """After the verdict: give hosts that have not joined yet up to ``timeout_s`` to come and hear it."""
        end = time.monotonic() + timeout_s
        with self._state:
            while not set(self.expected) <= self._joined:
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._state.wait(min(left, 0.5))

    def _send_all(self, kind: str, shared: dict[str, str] | None = None, **fields) -> None:
        with self._state:
            links = list(self._links.values())
        for link in links:
            try:
                link.send_shared(kind, shared, **fields)
            except OSError:
                pass

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            try:  # wakes the accept loop: closing alone leaves it blocked, still accepting, on Linux
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            close_quietly(self._sock)
        self._reader.close()
        with self._state:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            link.close()
        self._refusals.summary()
