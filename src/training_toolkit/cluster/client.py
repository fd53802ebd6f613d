"""The control channel's followers: join the lead, report, hear the verdict."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from queue import SimpleQueue

from training_toolkit.cluster import wire
from training_toolkit.cluster.events import MarkShared, PeerLost, RestartCalled, StacksWanted, Verdict, reported_time
from training_toolkit.cluster.link import Link, Refused, start_thread
from training_toolkit.cluster.timing import HEARTBEAT_S, JOIN_ATTEMPT_S, TIMEOUT_S
from training_toolkit.core.errors import ClusterError, Interrupted, JobFailed, LeadLost
from training_toolkit.job.attempt import Attempt

# Retries while the lead is not listening yet: a refused connection costs nothing, and every host
# waits for the slowest join, so retry often (a doubling 50 ms backoff cost up to 100 ms per job start).
RETRY_FIRST_S = 0.01
RETRY_MAX_S = 0.25


class Unreachable(ClusterError):
    """Nobody answered on the lead's channel within the deadline (not a refusal: nobody refused)."""

    def __init__(self, lead: str, port: int, deadline_s: float, last: str):
        super().__init__(f"could not reach the control channel on {lead}:{port} within {deadline_s:g} s: {last}")
        self.last = last


class ControlClient:
    """Joins the channel of the lead (``lead``) as ``host``, telling it ``introduction``.

    After ``connect``: ``job_id``, the lead's ``introduction``,
    ``job_attempt`` (the job's attempt, and whether its processes had started:
    a host whose ``train`` restarted comes into a running job) and ``hosts``
    (the job's hosts in rank order, as the lead knows them) are what its
    welcome carried; ``peers``, every seated host's introduction, is what the last go carried.  ``source`` is the local address to join from
    (None: the one the route picks); the lead admits by address where
    there is no secret, so a host with several addresses joins from the one
    its name resolves to (and a benchmark gives each of its hosts its own).
    """

    def __init__(
        self,
        secret: bytes | None,
        host: str,
        lead: str,
        port: int,
        events: SimpleQueue,
        *,
        introduction: Mapping[str, str] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = TIMEOUT_S,
        source: str | None = None,
    ):
        self._secret = secret
        self._source = source
        self.host = host
        self.lead = lead
        self.port = port
        self._introduction = dict(introduction or {})
        self._events = events
        self._heartbeat_s = heartbeat_s
        self._timeout_s = timeout_s
        self._link: Link | None = None
        self.job_id = ""
        self.introduction: dict[str, str] = {}
        self.job_attempt: tuple[int, bool] = (0, False)  # the job's attempt at the welcome, and whether it had started
        self.hosts: tuple[str, ...] = ()  # the job's hosts, from the welcome
        self._went = Attempt(-1, ())  # the last attempt the lead started, as its go said it
        self.peers: dict[str, dict[str, str]] = {}  # every seated host's introduction, from the last go
        self._ended: Verdict | str | None = None
        self._state = threading.Condition()  # its lock is an RLock: ``interrupt`` may take it from a signal handler
        self._closed = threading.Event()
        self._interrupted = threading.Event()
        self._joining: socket.socket | None = None  # the socket of a join in progress (``interrupt`` shuts it)

    def connect(self, deadline_s: float) -> None:
        """Join, retrying until the deadline: the lead may start after us."""
        end = time.monotonic() + deadline_s
        delay = RETRY_FIRST_S
        last = "no attempt"
        while True:
            try:
                self._check_interrupted()
                self._join(min(JOIN_ATTEMPT_S, max(0.5, end - time.monotonic())))
                return
            except Refused as exc:
                raise ClusterError(f"control channel on {self.lead}:{self.port} refused {self.host}: {exc}") from None
            except (OSError, ValueError, ConnectionError) as exc:
                last = str(exc) or type(exc).__name__
            self._check_interrupted()
            if time.monotonic() + delay >= end:
                raise Unreachable(self.lead, self.port, deadline_s, last)
            self._interrupted.wait(delay)
            delay = min(delay * 1.5, RETRY_MAX_S)

    def try_join(self, timeout: float) -> bool:
        """One join attempt, at most ``timeout`` to connect (the handshake then has its own): joined, or not (nobody
        serves there, or it refused this host).  For a host back after its loss, looking for a job that runs without it."""
        try:
            self._join(JOIN_ATTEMPT_S, connect_timeout=timeout)
        except (Refused, OSError, ValueError, ConnectionError):
            return False
        return True

    def _join(self, timeout: float, connect_timeout: float | None = None) -> None:
        deadline = time.monotonic() + timeout
        sock = socket.create_connection((self.lead, self.port), timeout=connect_timeout or timeout,
                                        source_address=(self._source, 0) if self._source else None)
        sock.settimeout(timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = Link(sock, self.lead)
        self._joining = sock
        try:
            self._check_interrupted()  # shut before it was known: the join's reads would wait their timeout
            challenge = link.recv_raw(deadline)
            server_nonce = challenge.get("nonce")
            if challenge.get("t") != "challenge" or challenge.get("v") != wire.PROTOCOL or not wire.is_nonce(server_nonce):
                raise Refused(f"not a training-toolkit control channel of protocol {wire.PROTOCOL}")
            exchange, client_nonce = wire.KeyExchange(), wire.nonce()
            keys = exchange.keys(challenge.get("kx"), self._secret,
                                 wire.transcript(server_nonce, client_nonce, str(challenge.get("kx")), exchange.public, self.host))
            link.send_raw({"t": "hello", "host": self.host, "nonce": client_nonce, "kx": exchange.public,
                           "intro": self._introduction,
                           "mac": wire.mac(keys.auth, "hello", wire.canonical(self._introduction))})
            answer = link.recv_raw(deadline, wire.MAX_WELCOME)
            if answer.get("t") == "reject":
                raise Refused(wire.text(answer, "reason", optional=True) or "rejected")
            welcome = answer.get("t") == "welcome"
            job_id = wire.text(answer, "job", limit=64) if welcome else ""
            introduction = wire.introduction(answer)
            at = wire.job_attempt(answer) if welcome else (0, False)
            hosts = wire.hosts(answer) if welcome else ()
            if not welcome or not wire.verify(keys.auth, answer.get("mac"), *wire.welcome_signed(
                    job_id or "", introduction, {"n": at[0], "go": at[1]}, hosts)):
                raise Refused("the lead failed authentication (a different job secret?)")
        except BaseException:
            link.close()
            raise
        finally:
            self._joining = None
        link.key = keys.session
        self.job_id, self.introduction, self.job_attempt, self.hosts = job_id or "", introduction, at, hosts
        sock.settimeout(self._timeout_s)
        self._link = link
        start_thread(self._read_loop, "control-read")
        start_thread(self._heartbeat_loop, "control-heartbeat")

    def _read_loop(self) -> None:
        assert self._link is not None
        try:
            while True:
                message = self._link.recv(wire.MAX_WELCOME)  # a go lists every host's introduction
                kind = message.get("t")
                if kind == "go":
                    active = wire.active(message, self.hosts)
                    spares, intros = wire.spares(message, self.hosts, active), wire.introductions(message, self.hosts)
                    went = Attempt(wire.attempt(message), active, spares, wire.retired(message, self.hosts,
                                   (*active, *spares)), wire.causes(message, self.hosts))
                    with self._state:
                        self._went, self.peers = went, intros
                        self._state.notify_all()
                elif kind == "restart":
                    self._post(RestartCalled(wire.attempt(message), wire.text(message, "reason") or "",
                                             wire.cause(message, self.hosts)))
                elif kind == "stacks?":
                    self._post(StacksWanted())
                elif kind == "mark":
                    marked = wire.text(message, "host", limit=255)
                    if marked in self.hosts:  # a stranger's name is no mark (its own: the record's rule drops it)
                        self._post(MarkShared(marked, wire.attempt(message), reported_time(message.get("at"), time.time())))
                elif kind == "verdict":
                    verdict = Verdict(wire.exit_code(message), wire.text(message, "reason", optional=True),
                                      wire.text(message, "host", limit=255, optional=True),
                                      wire.text(message, "summary", optional=True))
                    self._end(verdict)
                    return
        except (OSError, ValueError, ConnectionError) as exc:
            if not self._closed.is_set():
                reason = "timed out" if isinstance(exc, socket.timeout) else str(exc) or type(exc).__name__
                self._end(f"lost the lead {self.lead} ({reason})")

    def _end(self, ending: Verdict | str) -> None:
        with self._state:
            if self._ended is not None:
                return
            self._ended = ending
            self._state.notify_all()
        self._post(ending if isinstance(ending, Verdict) else PeerLost(self.lead, ending, time.time()))

    def _post(self, event) -> None:
        """An event for the agent, unless this link was closed (a lead not followed, a probe's, a lost one's)."""
        if not self._closed.is_set():
            self._events.put(event)

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

    def ready(self, attempt: int = 0) -> None:
        self._send("ready", n=attempt)

    def failed(self, reason: str, exit_code: int, at: float | None = None, attempt: int = 0,
               stopped: bool = False) -> None:
        """Report this host's failure, and when it happened (wall clock; None: now)."""
        self._send("failed", reason=reason, code=exit_code, at=time.time() if at is None else at, n=attempt,
                   stop=stopped)

    def progress(self, heartbeat: bool, checkpoint: bool = False) -> None:
        self._send("progress", hb=heartbeat, **({"ck": True} if checkpoint else {}))

    def send_stacks(self, stacks: list) -> None:
        """This host's ranks' stacks (``RankStack.to_wire`` each), as many as fit in one frame."""
        while stacks and len(wire.encode({"stacks": stacks})) > wire.MAX_FRAME - 1024:
            stacks = stacks[:-1]
        self._send("stacks", stacks=stacks)

    def done(self, exit_code: int) -> None:
        self._send("done", code=exit_code)

    def wait_go(self, deadline_s: float, attempt: int = 0) -> tuple[str, ...]:
        """Wait for the lead to start ``attempt``; its active hosts."""
        return self.wait_seats(deadline_s, attempt).active

    def wait_seats(self, deadline_s: float, attempt: int = 0) -> Attempt:
        """Wait for the lead to start ``attempt`` (or a newer one: it went on without this host meanwhile); the
        attempt its go started, as the go said it (no active hosts: a channel that names none, a test's)."""
        end = time.monotonic() + deadline_s
        with self._state:
            while self._went.number < attempt:
                if isinstance(self._ended, Verdict):
                    verdict = self._ended
                    raise JobFailed(verdict.reason or f"the job ended with code {verdict.exit_code}", verdict.exit_code,
                                    verdict.summary)
                if isinstance(self._ended, str):  # the only other ending: the lead's loss
                    raise LeadLost(self._ended, self.lead)
                self._check_interrupted()
                left = end - time.monotonic()
                if left <= 0:
                    raise ClusterError(f"the lead {self.lead} did not start the job within {deadline_s:g} s")
                self._state.wait(min(left, 1.0))
            return self._went

    def interrupt(self) -> None:
        """End a join or a wait for the go now, with ``Interrupted``: the agent got a stopping signal during setup.

        Called from the agent's signal handler: it sets a flag, shuts a joining socket, and wakes the wait.
        """
        self._interrupted.set()
        sock = self._joining
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._state:
            self._state.notify_all()

    def _check_interrupted(self) -> None:
        if self._interrupted.is_set():
            raise Interrupted(f"{self.host}: setup interrupted by a stopping signal")

    def close(self) -> None:
        self._closed.set()
        if self._link is not None:
            self._link.close()
