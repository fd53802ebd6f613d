"""The first host's reader: joins and seated hosts heard from one thread, over real sockets."""

from __future__ import annotations

import socket
import threading
import time
from queue import Empty, SimpleQueue

import pytest

from training_toolkit.cluster import wire
from training_toolkit.cluster.link import Link
from training_toolkit.cluster.reader import LinkReader

KEY = b"k" * 32


@pytest.fixture
def reader():
    got: SimpleQueue = SimpleQueue()
    r = LinkReader(lambda host, message: got.put(("message", host, message["t"])),
                   lambda host, link, reason: got.put(("lost", host, reason)), timeout_s=1.0)
    r.start()
    r.got = got
    yield r
    r.close()


def pair() -> tuple[Link, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    return Link(ours, "peer"), theirs


def next_event(queue: SimpleQueue, timeout: float = 5.0):
    return queue.get(timeout=timeout)


def seat(reader, link: Link, host: str = "w1") -> SimpleQueue:
    hellos: SimpleQueue = SimpleQueue()

    def on_hello(frame: dict) -> str:
        hellos.put(frame)
        link.key = KEY
        return host

    reader.join(link, time.monotonic() + 5, on_hello, lambda reason: hellos.put(("failed", reason)))
    return hellos


def test_a_hello_in_pieces_then_signed_messages_in_one_piece_arrive_whole_and_in_order(reader):
    link, peer = pair()
    hellos = seat(reader, link)
    hello = wire.encode({"t": "hello", "host": "w1"})
    peer.sendall(hello[:5])
    time.sleep(0.05)  # the reader sees the first piece alone (a later piece completes it)
    sender = Link(peer, "first")
    sender.key = KEY
    peer.sendall(hello[5:] + wire.sign(KEY, 1, "ready", {}) + wire.sign(KEY, 2, "done", {"code": 0}))
    assert next_event(hellos) == {"t": "hello", "host": "w1"}
    assert [next_event(reader.got) for _ in range(2)] == [("message", "w1", "ready"), ("message", "w1", "done")]
    peer.close()
    assert next_event(reader.got) == ("lost", "w1", "connection closed")


def test_a_join_silent_past_its_deadline_fails_once_and_is_not_read_again(reader):
    link, peer = pair()
    failures: SimpleQueue = SimpleQueue()
    reader.join(link, time.monotonic() + 0.2, lambda frame: failures.put(("hello", frame)),
                lambda reason: failures.put(reason))
    assert next_event(failures) == "deadline"
    peer.sendall(wire.encode({"t": "hello"}))
    with pytest.raises(Empty):
        failures.get(timeout=0.5)


def test_a_seated_host_silent_for_the_timeout_is_lost(reader):
    link, peer = pair()
    hellos = seat(reader, link)
    peer.sendall(wire.encode({"t": "hello"}))
    next_event(hellos)
    started = time.monotonic()
    assert next_event(reader.got) == ("lost", "w1", "timed out")
    assert 0.9 <= time.monotonic() - started < 4.0  # timeout_s = 1, swept every 0.25 s (generous on a loaded machine)
    peer.close()


def test_a_forged_message_loses_the_host(reader):
    link, peer = pair()
    hellos = seat(reader, link)
    peer.sendall(wire.encode({"t": "hello"}) + wire.sign(b"x" * 32, 1, "ready", {}))
    next_event(hellos)
    assert next_event(reader.got) == ("lost", "w1", "message failed authentication")
    peer.close()


def test_close_ends_pending_joins_and_calls_nothing_more():
    got: SimpleQueue = SimpleQueue()
    r = LinkReader(lambda *a: got.put(a), lambda *a: got.put(a), timeout_s=1.0)
    r.start()
    link, peer = pair()
    r.join(link, time.monotonic() + 30, lambda frame: got.put(frame), lambda reason: got.put(reason))
    r.close()  # registered by the loop or still queued: closed either way
    peer.settimeout(5)
    assert peer.recv(10) == b""  # the pending join's socket was closed
    assert got.empty()
    late, _ = pair()
    failed = threading.Event()
    r.join(late, time.monotonic() + 30, lambda frame: None, lambda reason: failed.set())
    assert failed.is_set()  # a join after the end is refused at once


def test_a_seated_link_given_up_is_closed_by_the_reader_and_its_descriptor_reused_at_once_reads_on(reader):
    """A host's seat taken again by its new link (server: ``stale``): the old link is given up to the reader, which
    stops reading it before it closes it.  Closed elsewhere while still registered, its descriptor went to the next
    link accepted, whose register then raised in the reader's thread (``FD 17 is already registered``): the thread
    died and no host was heard again (CI: a join then timed out)."""
    old, old_peer = pair()
    hellos = seat(reader, old)
    old_peer.sendall(wire.encode({"t": "hello"}))
    next_event(hellos)
    number = old.sock.fileno()
    reader.give_up(old)
    old_peer.settimeout(5)
    assert old_peer.recv(10) == b""  # closed, by the reader
    new, new_peer = pair()  # the lowest free descriptor: the old link's, most often
    reused = new.sock.fileno() == number
    hellos = seat(reader, new, "w2")
    new_peer.sendall(wire.encode({"t": "hello"}))
    assert next_event(hellos) == {"t": "hello"}
    sender = Link(new_peer, "first")
    sender.key = KEY
    new_peer.sendall(wire.sign(KEY, 1, "ready", {}))
    assert next_event(reader.got) == ("message", "w2", "ready"), reused
    with pytest.raises(Empty):  # the old link's end was no loss
        reader.got.get(timeout=0.3)
    old_peer.close(), new_peer.close()


def test_a_link_given_up_after_the_end_is_closed_at_once():
    r = LinkReader(lambda *a: None, lambda *a: None, timeout_s=1.0)
    r.start()
    r.close()
    link, peer = pair()
    r.give_up(link)
    peer.settimeout(5)
    assert peer.recv(10) == b""


def test_a_link_given_up_on_the_readers_own_thread_is_closed_at_once_and_the_new_one_reads_on(reader):
    """As the server does: the new link's hello seats the host, and the old link is given up from that callback."""
    old, old_peer = pair()
    hellos = seat(reader, old)
    old_peer.sendall(wire.encode({"t": "hello"}))
    next_event(hellos)
    new, new_peer = pair()
    taken: SimpleQueue = SimpleQueue()

    def on_hello(frame: dict) -> str:
        reader.give_up(old)
        taken.put(old.sock.fileno())  # -1: closed before the callback returned
        new.key = KEY
        return "w1"

    reader.join(new, time.monotonic() + 5, on_hello, lambda reason: taken.put(reason))
    new_peer.sendall(wire.encode({"t": "hello"}))
    assert next_event(taken) == -1
    old_peer.settimeout(5)
    assert old_peer.recv(10) == b""
    new_peer.sendall(wire.sign(KEY, 1, "ready", {}))
    assert next_event(reader.got) == ("message", "w1", "ready")
    with pytest.raises(Empty):  # the old link's end was no loss
        reader.got.get(timeout=0.3)
    old_peer.close(), new_peer.close()
