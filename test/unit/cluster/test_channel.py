"""The control channel over real sockets on loopback."""

import json
import socket
import time
from queue import Empty, SimpleQueue

import pytest

from training_toolkit.cluster import wire
from training_toolkit.cluster.client import ControlClient
from training_toolkit.cluster.events import MAX_REPORT_AGE_S, PeerDone, PeerFailed, PeerLost, Verdict, reported_time
from training_toolkit.cluster.server import ControlServer
from training_toolkit.core.errors import ClusterError, JobFailed

from helpers.first_host import FirstHost

SECRET = b"s" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Silence declares a peer lost after TIMEOUT_S: long enough that a loaded machine (a thread not
# scheduled for a second) never makes a test's peer look lost; the test of silence sets its own.
TIMEOUT_S = 10.0


def start_server(timeout_s: float = TIMEOUT_S):
    events = SimpleQueue()
    srv = ControlServer(SECRET, ["w1", "w2"], free_port(), events, bind="127.0.0.1", heartbeat_s=0.1, timeout_s=timeout_s)
    srv.start()
    return srv, FirstHost(srv, events)  # what the server posts, read (and its barriers decided) as the agent does


@pytest.fixture
def server():
    srv, events = start_server()
    yield srv, events
    srv.close()


def client(srv, host, secret=SECRET, **kw):
    events = SimpleQueue()
    c = ControlClient(secret, host, "127.0.0.1", srv.port, events, heartbeat_s=0.1, timeout_s=TIMEOUT_S, **kw)
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
    events.wait_ready(5)
    srv.release()
    c1.wait_go(5)
    c2.wait_go(5)
    c2.done(0)
    assert get(events) == PeerDone("w2", 0)
    t0 = time.monotonic()
    srv.broadcast(Verdict(3, "algo-1: boom", "algo-1", summary="summary: attempts=1 faults=1"))
    assert get(e1) == Verdict(3, "algo-1: boom", "algo-1")
    assert get(e2).summary == "summary: attempts=1 faults=1"  # the lead's line, for every host's log
    assert time.monotonic() - t0 < 2  # at once (not at a heartbeat or a timeout), with room for a loaded machine
    c1.close(), c2.close()


def test_barrier_deadline_names_missing_hosts(server):
    srv, events = server
    c1, _ = client(srv, "w1")
    c1.connect(5)
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"never joined: w2; joined but never ready: w1"):
        events.wait_ready(0.5)
    assert time.monotonic() - t0 < 5
    c1.close()


def test_failure_during_barrier_is_named(server):
    srv, events = server
    c1, _ = client(srv, "w1")
    c1.connect(5)
    c1.failed("w1: sshd could not listen on port 22", 69)
    with pytest.raises(JobFailed, match="^w1: sshd could not listen on port 22$") as failed:
        events.wait_ready(5)
    assert failed.value.exit_code == 69
    assert get(events) == PeerFailed("w1", "w1: sshd could not listen on port 22", 69)


def test_a_failure_report_carries_when_it_happened(server):
    srv, events = server
    c1, _ = client(srv, "w1")
    c1.connect(5)
    happened = time.time() - 0.3
    c1.failed("boom", 1, happened)
    assert get(events).at == happened
    c1.failed("boom again", 1)  # no time given: now
    assert abs(get(events).at - time.time()) < 1.0


@pytest.mark.parametrize("value, expected", [
    (98.5, 98.5),
    (100.0, 100.0),
    (101.0, 100.0),  # never after its arrival
    (1.0, 100.0 - MAX_REPORT_AGE_S),  # a clock far behind is believed only so far
    (None, 100.0), ("95", 100.0), (True, 100.0), (float("nan"), 100.0), (float("-inf"), 100.0),  # no usable time
])
def test_reported_time(value, expected):
    assert reported_time(value, 100.0) == expected


def test_wrong_secret_is_refused_both_ways(server):
    srv, _ = server
    bad, _ = client(srv, "w1", secret=b"x" * 32)
    with pytest.raises(ClusterError, match="refused w1: authentication failed"):
        bad.connect(2)
    good, _ = client(srv, "w1")
    good.connect(10)  # the refused attempt did not take the seat
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
    c1.connect(10)
    twin, _ = client(srv, "w1", source="127.0.0.2")  # the secret, but not where w1 joined from
    with pytest.raises(ClusterError, match="'w1' has joined already"):
        twin.connect(2)
    c1.close()


def test_a_host_that_joins_again_before_it_is_ready_takes_its_seat_back(server):
    """Its welcome came too late for it (it gave up): the held seat is its own, from the same address."""
    srv, events = server
    first, _, welcome = raw_join(srv.port, "w1")
    assert welcome["t"] == "welcome"
    again, _ = client(srv, "w1")
    again.connect(10)
    first.settimeout(5)
    while first.recv(4096):  # the server closes the first link (after any heartbeat it sent)
        pass
    first.close()
    other, _ = client(srv, "w2")
    other.connect(10)
    again.ready(), other.ready()
    events.wait_ready(10)
    srv.release()
    again.wait_go(10)
    with pytest.raises(Empty):  # the first link's end was no loss
        events.get(timeout=0.5)
    again.close(), other.close()


def test_master_unreachable_within_deadline():
    c = ControlClient(SECRET, "w1", "127.0.0.1", free_port(), SimpleQueue())
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"could not reach the control channel on 127.0.0.1:\d+ within 1 s"):
        c.connect(1.0)
    assert time.monotonic() - t0 < 5


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
    assert isinstance(lost, PeerLost) and "lost the lead" in lost.reason


def raw_join(port: int, host: str, secret: bytes | None = SECRET, intro: dict | None = None):
    """Join by hand, as the protocol says (tests see the wire, not the client): the socket, its reader, the welcome."""
    raw = socket.create_connection(("127.0.0.1", port))
    f = raw.makefile("rb")
    challenge = json.loads(f.readline())
    exchange, cn = wire.KeyExchange(), wire.nonce()
    keys = exchange.keys(challenge["kx"], secret, wire.transcript(challenge["nonce"], cn, challenge["kx"], exchange.public, host))
    intro = intro or {}
    raw.sendall(wire.encode({"t": "hello", "host": host, "nonce": cn, "kx": exchange.public, "intro": intro,
                             "mac": wire.mac(keys.auth, "hello", wire.canonical(intro))}))
    return raw, f, json.loads(f.readline())


def test_silent_peer_times_out():
    """A peer that stops talking (no close, no heartbeat) is declared lost after the timeout."""
    srv, events = start_server(timeout_s=1.0)
    try:
        raw, _, welcome = raw_join(srv.port, "w1")
        assert welcome["t"] == "welcome"
        t0 = time.monotonic()
        lost = get(events, timeout=10)
        assert isinstance(lost, PeerLost) and lost.reason == "timed out"
        assert 0.8 < time.monotonic() - t0 < 5
        raw.close()
    finally:
        srv.close()


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


# Without a platform secret: seats by address; introductions; an outsider's attempts --------------------


def eventually(condition, timeout_s: float = 10.0) -> bool:
    """Whether ``condition`` holds within ``timeout_s`` (polled): for what another thread writes."""
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def table_server(table, lines, **kw):
    """A server without a secret whose host names resolve through ``table``; refusals go to ``lines``."""
    from training_toolkit.cluster.admission import Addresses, Admission

    hosts = ["w1", "w2"]
    admission = Admission(hosts, by_address=True, addresses=Addresses(hosts, lambda n: table.get(n, frozenset())), **kw)
    events = SimpleQueue()
    srv = ControlServer(None, hosts, free_port(), events, bind="127.0.0.1", heartbeat_s=0.1, timeout_s=TIMEOUT_S,
                        job_id="j0b", introduction={"ssh_client_key": "ssh-ed25519 AAAA c"}, admission=admission,
                        log=lines.append, handshake_timeout_s=1.0)
    srv.start()
    return srv, FirstHost(srv, events)  # what the server posts, read (and its barriers decided) as the agent does


LOOPBACK = {"w1": frozenset({"127.0.0.1"}), "w2": frozenset({"127.0.0.2"})}


def test_without_a_secret_hosts_join_from_their_address_and_exchange_introductions():
    lines = []
    srv, _ = table_server(LOOPBACK, lines)
    try:
        c1 = ControlClient(None, "w1", "127.0.0.1", srv.port, SimpleQueue(), introduction={"ssh_host_key": "k1"})
        c1.connect(5)
        assert (c1.job_id, c1.introduction) == ("j0b", {"ssh_client_key": "ssh-ed25519 AAAA c"})
        # recorded by the server's reader just after it sent the welcome the client has read (before it reads
        # anything more from w1: so always before w1's "ready", which is when a runner reads it)
        assert eventually(lambda: srv.introductions == {"w1": {"ssh_host_key": "k1"}})
        # w2 resolves to 127.0.0.2, but this claimant comes from 127.0.0.1: refused, and named in the log
        c2 = ControlClient(None, "w2", "127.0.0.1", srv.port, SimpleQueue())
        with pytest.raises(ClusterError, match="'w2' does not resolve to 127.0.0.1"):
            c2.connect(2)
        # a second claimant of a seat whose host is ready
        c1.ready()
        assert eventually(lambda: "w1" in srv._ready)
        twin = ControlClient(None, "w1", "127.0.0.1", srv.port, SimpleQueue())
        with pytest.raises(ClusterError, match="'w1' has joined already"):
            twin.connect(2)
        c1.close()
    finally:
        srv.close()
    # the server logs from its own thread, maybe after the client has read the refusal
    assert eventually(lambda: "control channel: refused a connection from 127.0.0.1: 'w2' does not resolve to 127.0.0.1" in lines)
    assert eventually(lambda: "control channel: refused a connection from 127.0.0.1: 'w1' has joined already" in lines)


def test_a_job_address_claiming_invented_names_is_one_log_line_whatever_the_names():
    """Issue 17: 30 invented names from one address were 30 lines on the first host; now one, then a count."""
    lines = []
    srv, _ = table_server(LOOPBACK, lines)
    try:
        for i in range(30):
            with pytest.raises(ClusterError, match=f"'made-up-{i}' is not a host of this job"):
                ControlClient(None, f"made-up-{i}", "127.0.0.1", srv.port, SimpleQueue()).connect(2)
        # the server's thread records a refusal after the client has read it: wait for all 30
        assert eventually(lambda: srv._refusals._repeats["127.0.0.1"] == 29), lines
    finally:
        srv.close()  # summarises the repeats
    assert [line for line in lines if "127.0.0.1" in line] == [
        "control channel: refused a connection from 127.0.0.1: 'made-up-0' is not a host of this job",
        "control channel: refused 29 more connection(s) from 127.0.0.1"]


def test_without_a_secret_a_stranger_address_is_dropped_before_any_handshake():
    lines = []
    srv, _ = table_server({"w1": frozenset({"127.0.0.9"})}, lines)
    try:
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
        assert raw.recv(100) == b""  # closed before a challenge
        raw.close()
    finally:
        srv.close()
    assert eventually(lambda: lines == ["control channel: refused a connection from 127.0.0.1: not an address of this job's hosts"])


def test_a_secret_and_no_secret_do_not_mix(server):
    srv, _ = server
    c = ControlClient(None, "w1", "127.0.0.1", srv.port, SimpleQueue())
    with pytest.raises(ClusterError, match="authentication failed"):
        c.connect(2)


GARBAGE = [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x00\xff" * 100 + b"\n",
    b'{"t": "hello", "host": "w1"',  # truncated, then closed
    b"[" * 70_000,  # oversized, no end of line
    b'{"t": "hello", "host": "w1", "nonce": "00", "kx": "AAAA", "mac": "x"}\n',
    b'{"t": "hello", "host": ["w1"], "nonce": "' + b"0" * 32 + b'"}\n',
]


@pytest.mark.parametrize("payload", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_is_refused_with_one_line_and_the_job_goes_on(payload):
    lines = []
    srv, events = table_server(LOOPBACK, lines)
    try:
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        raw.recv(4096)  # the challenge
        try:
            raw.sendall(payload)
            raw.shutdown(socket.SHUT_WR)
            raw.recv(4096)
        except OSError:
            pass
        raw.close()
        # the refusal is logged before the server closes: a join still being read at close() is dropped
        # without a line (this read 0 lines when a loaded machine kept the reader past raw's timeout)
        assert eventually(lambda: any("refused" in line for line in lines), timeout_s=20), lines
        good = ControlClient(None, "w1", "127.0.0.1", srv.port, SimpleQueue())
        good.connect(10)
        good.close()
    finally:
        srv.close()
    refusals = [line for line in lines if "refused" in line]
    assert len(refusals) == 1 and "\n" not in refusals[0], lines


def test_a_silent_connection_is_dropped_at_the_handshake_deadline():
    lines = []
    srv, _ = table_server(LOOPBACK, lines)
    try:
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        raw.recv(4096)
        t0 = time.monotonic()
        assert raw.recv(4096) == b""  # the server hangs up
        assert time.monotonic() - t0 < 5
        raw.close()
    finally:
        srv.close()
    assert eventually(lambda: lines == ["control channel: refused a connection from 127.0.0.1: no complete join within 1 s"])


def test_a_replayed_hello_is_refused(server):
    """A hello captured from a real join, replayed on a new connection: another challenge, another key."""
    srv, _ = server
    raw = socket.create_connection(("127.0.0.1", srv.port))
    f = raw.makefile("rb")
    challenge = json.loads(f.readline())
    exchange, cn = wire.KeyExchange(), wire.nonce()
    keys = exchange.keys(challenge["kx"], SECRET, wire.transcript(challenge["nonce"], cn, challenge["kx"], exchange.public, "w1"))
    hello = wire.encode({"t": "hello", "host": "w1", "nonce": cn, "kx": exchange.public, "intro": {},
                         "mac": wire.mac(keys.auth, "hello", wire.canonical({}))})
    raw.close()
    replay = socket.create_connection(("127.0.0.1", srv.port))
    g = replay.makefile("rb")
    g.readline()
    replay.sendall(hello)
    assert json.loads(g.readline()) == {"t": "reject", "reason": "authentication failed"}
    replay.close()


def test_a_flood_of_connections_does_not_stall_the_barrier():
    lines = []
    srv, _ = table_server(LOOPBACK, lines, per_address=4)
    held = []
    try:
        for _ in range(300):  # from 127.0.0.1, the address of w1: only 4 get a handshake at a time
            try:
                held.append(socket.create_connection(("127.0.0.1", srv.port), timeout=2))
            except OSError:
                break
        t0 = time.monotonic()
        c1 = ControlClient(None, "w1", "127.0.0.1", srv.port, SimpleQueue())
        c1.connect(10)  # retries until a slot frees (the held ones time out after 1 s)
        assert time.monotonic() - t0 < 8
        c1.close()
    finally:
        for sock in held:
            sock.close()
        srv.close()
    assert sum("more than 4 joins at once from one address" in line for line in lines) == 1
    assert any(line.startswith("control channel: refused ") and "more connection(s) from 127.0.0.1" in line for line in lines)


def test_a_made_up_name_in_a_failed_join_does_not_make_a_new_log_line_each_time(server):
    """With a secret, failed joins from one address are one line, whatever host names they claim."""
    srv, _ = server
    lines = []
    srv._refusals._log = lines.append
    for name in ("x1", "x2", "x3"):
        bad = ControlClient(b"x" * 32, name, "127.0.0.1", srv.port, SimpleQueue())
        with pytest.raises(ClusterError, match="authentication failed"):
            bad.connect(2)
    # the server's thread records a refusal after the client has read it: wait for all three
    assert eventually(lambda: len(lines) == 1 and srv._refusals._repeats["127.0.0.1"] == 2)
    srv.close()
    assert lines == ["control channel: refused a connection from 127.0.0.1: failed authentication (a different job secret?)",
                     "control channel: refused 2 more connection(s) from 127.0.0.1"]


def test_a_closed_server_accepts_no_more_connections():
    srv = ControlServer(SECRET, ["w1"], free_port(), SimpleQueue(), bind="127.0.0.1")
    srv.start()
    srv.close()  # the listening socket is shut and closed before close returns: refused at once
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()
