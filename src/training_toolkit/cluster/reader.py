"""The lead's reader: one thread hears every host, joining or seated, instead of one thread per host.

A thread per host cost the lead more than the messages themselves
(bench/control_plane.py, docs/scale.md): at 1,000 hosts joining at once, a
thousand runnable threads each woke every 5 ms to ask for the interpreter's
lock, the lead spent a whole core in the kernel doing so, joins missed
their 5 s deadline and the job failed; once joined, each heartbeat woke its
own thread.  One thread waiting on every socket at once (epoll) wakes once for
every host that spoke meanwhile, and does each host's little work in turn.

A joining link waits here for its first frame (the hello), until its deadline;
a seated one for signed messages, and a host not heard for ``timeout_s`` is
lost, as a socket timeout said before.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from training_toolkit.cluster.link import Link, start_thread

CHUNK = 65536
# With many hosts, messages arrive one by one (every host's heartbeat on its own clock), and a wake-up
# for each cost more than the messages; waiting this long after a wake-up that found few gathers them,
# at the price of up to this much delay per message (nothing the barrier or a verdict notices).
GATHER_S = 0.02


@dataclass
class _Entry:
    link: Link
    host: str | None  # None while joining
    until: float  # joining: the join's deadline; seated: when it was last heard from
    on_hello: Callable[[dict], str | None] | None = None
    on_fail: Callable[[str], None] | None = None


class LinkReader:
    """Reads the links given to ``join``: their hello, then (once seated) every message.

    ``on_message(host, message)`` for every signed message of a seated host;
    ``on_lost(host, link, reason)`` once, when a seated host's link closed, sent
    something that is not a valid signed frame, or was silent for ``timeout_s``.
    All callbacks run on the reader's thread; a link is not read after its end.
    """

    def __init__(self, on_message: Callable[[str, dict], None], on_lost: Callable[[str, Link, str], None],
                 timeout_s: float):
        self._on_message = on_message
        self._on_lost = on_lost
        self._timeout_s = timeout_s
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._added: list[_Entry] = []
        self._given_up: list[Link] = []  # seated links to stop reading and close, on the reader's thread
        self._entries: dict[Link, _Entry] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread: int | None = None  # the reader's thread, once it runs

    def start(self) -> None:
        start_thread(self._loop, "control-read")

    def join(self, link: Link, deadline: float, on_hello: Callable[[dict], str | None],
             on_fail: Callable[[str], None]) -> None:
        """Wait for ``link``'s first frame until ``deadline`` (monotonic).

        ``on_hello(frame)`` returns the host now seated on it (read from then
        on), or None once it refused and closed the link;
        ``on_fail(reason)`` is called instead on a closed link, a bad frame, or
        the deadline (the reason then is "deadline").
        """
        self._put(_Entry(link, None, deadline, on_hello, on_fail))

    def give_up(self, link: Link) -> None:
        """Stop reading ``link`` and close it, calling nothing (a seat taken again by the host's new link).

        Closed on the reader's thread once it is no longer registered: a link closed elsewhere while registered
        leaves its descriptor in the selector, and the next link accepted, given that same descriptor by the
        kernel, could not be registered (the reader's thread ended, and no host was heard again).
        """
        if threading.get_ident() == self._thread:  # a join seated on the reader's own thread (``on_hello``): now, so
            self._drop(link)  # that no frame of the old link is taken for the host's after this
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._given_up.append(link)
        if closed:
            link.close()
        else:
            self._wake()

    def close(self) -> None:
        """Stop reading, calling nothing more; the links themselves are the caller's."""
        with self._lock:
            self._closed = True
        self._wake()

    def _put(self, entry: _Entry) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._added.append(entry)
        if closed:
            assert entry.on_fail is not None
            entry.on_fail("the job is over")
        else:
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # the loop has ended, or its wake-up buffer is full: it wakes anyway
            pass

    def _loop(self) -> None:
        self._thread = threading.get_ident()
        tick = min(0.5, self._timeout_s / 4)
        next_sweep = time.monotonic() + tick
        try:
            while True:
                ready = self._selector.select(tick)
                with self._lock:
                    if self._closed:
                        return
                    added, self._added = self._added, []
                    given_up, self._given_up = self._given_up, []
                for link in given_up:  # before any new link is registered: a descriptor freed here may be the next's
                    self._drop(link)
                for entry in added:
                    try:
                        self._selector.register(entry.link.sock, selectors.EVENT_READ, entry)
                    except (KeyError, ValueError, OSError) as exc:  # one join that cannot be read fails alone
                        assert entry.on_fail is not None
                        entry.on_fail(f"cannot be read: {exc}")
                        continue
                    self._entries[entry.link] = entry
                for key, _ in ready:
                    if key.data is None:
                        self._drain_wake()
                    elif self._entries.get(key.data.link) is key.data:
                        self._read(key.data)
                if len(ready) < len(self._entries) // 8:
                    time.sleep(GATHER_S)  # let more hosts speak before the next wake-up: one per host costs most
                now = time.monotonic()
                if now >= next_sweep:  # every tick, not every wake-up: a sweep walks every host
                    self._sweep(now)
                    next_sweep = now + tick
        finally:
            with self._lock:  # a join or a link given up from now on is ended at once (``_put``, ``give_up``)
                self._closed = True
            for entry in [*self._entries.values(), *self._added]:
                if entry.host is None:  # a join cut short by the end of the job; seated links are the caller's
                    entry.link.close()
            for link in self._given_up:
                link.close()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _sweep(self, now: float) -> None:
        for entry in list(self._entries.values()):
            if entry.host is None and now > entry.until:
                self._end(entry, "deadline")
            elif entry.host is not None and now - entry.until > self._timeout_s:
                self._end(entry, "timed out")

    def _read(self, entry: _Entry) -> None:
        try:
            chunk = entry.link.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return
        except OSError as exc:
            self._end(entry, str(exc) or type(exc).__name__)
            return
        if not chunk:
            self._end(entry, "connection closed" + (" mid-frame" if entry.link.buffered else ""))
            return
        now = time.monotonic()
        if entry.host is None:
            self._hello(entry, chunk, now)
        else:
            entry.until = now
            self._take(entry, chunk)

    def _hello(self, entry: _Entry, chunk: bytes, now: float) -> None:
        try:
            frame = entry.link.first_raw(chunk)
        except ValueError as exc:
            self._end(entry, str(exc))
            return
        if frame is None:
            return
        assert entry.on_hello is not None
        try:
            host = entry.on_hello(frame)
        except Exception as exc:  # noqa: BLE001 - a bug in one join must not leave every host unheard
            self._end(entry, f"{type(exc).__name__}: {exc}")
            return
        if host is None:
            self._forget(entry)
            return
        entry.host, entry.until, entry.on_hello, entry.on_fail = host, now, None, None
        self._take(entry, b"")

    def _take(self, entry: _Entry, chunk: bytes) -> None:
        assert entry.host is not None
        try:
            for message in entry.link.frames(chunk):
                self._on_message(entry.host, message)
        except (ValueError, ConnectionError) as exc:
            self._end(entry, str(exc) or type(exc).__name__)

    def _end(self, entry: _Entry, reason: str) -> None:
        if not self._forget(entry):
            return
        if entry.host is None:
            assert entry.on_fail is not None
            entry.on_fail(reason)
        else:
            self._on_lost(entry.host, entry.link, reason)

    def _drop(self, link: Link) -> None:
        """On the reader's thread: ``link`` unregistered (if it still was), then closed, calling nothing."""
        entry = self._entries.get(link)
        if entry is not None:
            self._forget(entry)
        link.close()

    def _forget(self, entry: _Entry) -> bool:
        if self._entries.get(entry.link) is not entry:
            return False
        del self._entries[entry.link]
        try:
            self._selector.unregister(entry.link.sock)
        except (KeyError, ValueError, OSError):
            pass
        return True

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

