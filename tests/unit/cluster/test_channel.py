"""The control channel over real sockets on loopback."""

import hashlib
import hmac
import json
import secrets
import socket
import time
from queue import Empty, SimpleQueue

import pytest

from training_toolkit.cluster.channel import (ControlClient, ControlServer, PeerDone, PeerFailed, PeerLost,
                                              Verdict)
from training_toolkit.errors import ClusterError, JobFailed

SECRET = b"s" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    events = SimpleQueue()
    srv = ControlServer(SECRET, ["w1", "w2"], free_port(), events, bind="127.0.0.1", heartbeat_s=0.1, timeout_s=1.0)
    srv.start()
    yield srv, events
    srv.close()


def client(srv, host, secret=SECRET, **kw):
    events = SimpleQueue()
    c = ControlClient(secret, host, "127.0.0.1", srv.port, events, heartbeat_s=0.1, timeout_s=1.0, **kw)
    return c, events


def get(events, timeout=5.0):
    return events.get(timeout=timeout)


def test_barrier_release_and_verdict(server):
    srv, events = server
    c1, e1 = client(srv, "w1")
    c2, e2 = client(srv, "w2")
    c1.connect(5)
    c2.connect(5)
    c1.ready()
    c2.ready()
    srv.wait_ready(5)
    srv.release()
    c1.wait_go(5)
    c2.wait_go(5)
    c2.done(0)
    assert get(events) == PeerDone("w2", 0)
    t0 = time.monotonic()
    srv.broadcast(Verdict(3, "algo-1: boom", "algo-1"))
    assert get(e1) == Verdict(3, "algo-1: boom", "algo-1")
    assert get(e2) == Verdict(3, "algo-1: boom", "algo-1")
    assert time.monotonic() - t0 < 0.5
    c1.close(), c2.close()


def test_barrier_deadline_names_missing_hosts(server):
    srv, _ = server
    c1, _ = client(srv, "w1")
    c1.connect(5)
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"never joined: w2; joined but never ready: w1"):
        srv.wait_ready(0.5)
    assert time.monotonic() - t0 < 2
    c1.close()


def test_failure_during_barrier_is_named(server):
    srv, events = server
    c1, _ = client(srv, "w1")
    c1.connect(5)
    c1.failed("w1: sshd could not listen on port 22", 69)
    with pytest.raises(JobFailed, match="^w1: sshd could not listen on port 22$") as failed:
        srv.wait_ready(5)
    assert failed.value.exit_code == 69
    assert get(events) == PeerFailed("w1", "w1: sshd could not listen on port 22", 69)


def test_wrong_secret_is_refused_both_ways(server):
    srv, _ = server
    bad, _ = client(srv, "w1", secret=b"x" * 32)
    with pytest.raises(ClusterError, match="refused w1: authentication failed"):
        bad.connect(2)
    good, _ = client(srv, "w1")
    good.connect(2)  # the refused attempt did not take the seat
    good.close()


def test_server_with_another_secret_is_refused():
    impostor = ControlServer(b"y" * 32, ["w1"], free_port(), SimpleQueue(), bind="127.0.0.1")
    impostor.start()
    c = ControlClient(SECRET, "w1", "127.0.0.1", impostor.port, SimpleQueue())
    with pytest.raises(ClusterError, match="authentication failed"):
        c.connect(2)
    impostor.close()


def test_unknown_and_duplicate_hosts_are_refused(server):
    srv, _ = server
    stranger, _ = client(srv, "w9")
    with pytest.raises(ClusterError, match="'w9' is not a host of this job"):
        stranger.connect(2)
    c1, _ = client(srv, "w1")
    c1.connect(2)
    twin, _ = client(srv, "w1")
    with pytest.raises(ClusterError, match="'w1' has joined already"):
        twin.connect(2)
    c1.close()


def test_master_unreachable_within_deadline():
    c = ControlClient(SECRET, "w1", "127.0.0.1", free_port(), SimpleQueue())
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"could not reach the control channel on 127.0.0.1:\d+ within 1 s"):
        c.connect(1.0)
    assert time.monotonic() - t0 < 3


def test_lost_peers_are_reported_both_ways(server):
    srv, events = server
    c1, e1 = client(srv, "w1")
    c1.connect(5)
    c1.close()
    assert isinstance(get(events), PeerLost)
    c2, e2 = client(srv, "w2")
    c2.connect(5)
    srv.close()
    lost = get(e2)
    assert isinstance(lost, PeerLost) and "lost the first host" in lost.reason


def test_silent_peer_times_out(server):
    """A peer that stops talking (no close, no heartbeat) is declared lost after the timeout."""
    srv, events = server
    raw = socket.create_connection(("127.0.0.1", srv.port))
    f = raw.makefile("rb")
    challenge = json.loads(f.readline())
    cn = secrets.token_hex(16)
    mac = hmac.new(SECRET, "|".join(["hello", challenge["nonce"], cn, "w1"]).encode(), hashlib.sha256).hexdigest()
    raw.sendall((json.dumps({"t": "hello", "host": "w1", "nonce": cn, "mac": mac}) + "\n").encode())
    assert json.loads(f.readline())["t"] == "welcome"
    t0 = time.monotonic()
    lost = get(events, timeout=5)
    assert isinstance(lost, PeerLost) and lost.reason == "timed out"
    assert 0.8 < time.monotonic() - t0 < 3
    raw.close()


def test_forged_or_replayed_messages_drop_the_peer(server):
    srv, events = server
    c1, _ = client(srv, "w1")
    c1.connect(5)
    link = c1._link
    body = {"t": "ready", "seq": 99, "mac": "00"}
    link.send_raw(body)
    lost = get(events)
    assert isinstance(lost, PeerLost) and "authentication" in lost.reason
    with pytest.raises(Empty):
        events.get(timeout=0.2)


def test_late_joiner_gets_the_verdict(server):
    srv, _ = server
    srv.broadcast(Verdict(1, "w2: boom", "algo-1"))
    c1, e1 = client(srv, "w1")
    c1.connect(5)
    assert get(e1) == Verdict(1, "w2: boom", "algo-1")
    with pytest.raises(JobFailed, match="^w2: boom$") as failed:
        c1.wait_go(2)
    assert failed.value.exit_code == 1
