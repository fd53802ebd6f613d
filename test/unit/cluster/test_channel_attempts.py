"""The channel's part in restarts and stalls, over real sockets: attempts, progress, stacks."""

from __future__ import annotations

import socket
import threading
import time
from queue import SimpleQueue

import pytest

from training_toolkit.cluster import wire
from training_toolkit.cluster.client import ControlClient
from training_toolkit.cluster.events import PeerFailed
from training_toolkit.cluster.server import ControlServer
from training_toolkit.cluster.events import PeerProgress, RestartCalled, StacksWanted
from training_toolkit.core.errors import ClusterError, JobFailed
from training_toolkit.job.attempt import Attempt

from helpers.first_host import FirstHost

SECRET = b"s" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(events, timeout=5.0):
    return events.get(timeout=timeout)


@pytest.fixture
def job():
    events = SimpleQueue()
    srv = ControlServer(SECRET, ["w1", "w2"], free_port(), events, bind="127.0.0.1", heartbeat_s=0.1, timeout_s=2.0)
    srv.start()
    clients = []
    for host in ("w1", "w2"):
        client_events = SimpleQueue()
        c = ControlClient(SECRET, host, "127.0.0.1", srv.port, client_events, heartbeat_s=0.1, timeout_s=2.0)
        c.connect(5)
        clients.append((c, client_events))
    for c, _ in clients:
        c.ready(0)
    first = FirstHost(srv, events)
    first.wait_ready(5)
    srv.release()
    for c, _ in clients:
        c.wait_go(5, 0)
    yield srv, first, clients
    for c, _ in clients:
        c.close()
    srv.close()


def test_a_restart_reaches_every_host_and_the_next_barrier_counts_only_its_own_readies(job):
    srv, first, [(c1, e1), (c2, e2)] = job
    c1.failed("w1: boom", 1, attempt=0)
    assert first.get().host == "w1"
    first.restart(1, "w1: boom")
    assert get(e1) == RestartCalled(1, "w1: boom") and get(e2) == RestartCalled(1, "w1: boom")
    c2.failed("w2: a consequence, sent late", 1, attempt=0)  # of the attempt that is over: no barrier failure
    assert first.get() == PeerFailed("w2", "w2: a consequence, sent late", 1, attempt=0)
    c1.ready(0)  # a stale ready does not count
    with pytest.raises(ClusterError, match="joined but never ready: w1, w2"):
        first.wait_ready(0.5)
    c1.ready(1)
    c2.ready(1)
    first.wait_ready(5)
    srv.release()
    c1.wait_go(5, 1)
    c2.wait_go(5, 1)


def test_a_client_waits_for_the_go_of_its_own_attempt(job):
    _, _, [(c1, _), _] = job
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="did not start the job"):
        c1.wait_go(0.5, 1)  # the go of attempt 0 came before: not this one
    assert time.monotonic() - t0 >= 0.5


def test_a_client_late_for_its_attempt_hears_the_newer_one_the_lead_started(job):
    srv, first, [(c1, _), (c2, _)] = job
    c1.hosts = ("w1", "w2")  # what Membership takes from the welcome
    first.restart(1, "w2: boom")
    first.restart(2, "w2: boom again")  # the lead went on twice while w1 was slow to come back
    c2.ready(2)
    srv.release(Attempt(2, ("w2",), ("w1",)))
    c1.ready(1)
    assert c1.wait_seats(5, 1) == Attempt(2, ("w2",), ("w1",))  # the go's attempt, not the one w1 waited for


def test_the_leads_marks_reach_every_host_of_the_job(job):
    srv, _, [(c1, e1), (c2, e2)] = job
    for c in (c1, c2):
        c.hosts = ("m", "w1", "w2")  # what Membership takes from the welcome
    before = time.time()
    srv.mark("w1", 2)
    srv.mark("m", 3)
    after = time.time()
    told = [get(e2), get(e2), get(e1), get(e1)]  # each host hears every mark, its own too: its record drops it
    assert [(m.host, m.attempt) for m in told] == [("w1", 2), ("m", 3), ("w1", 2), ("m", 3)]
    assert all(before <= m.at <= after for m in told)  # when the lead told of it, by its clock
    srv.mark("stranger", 3)  # no host of the job: no mark, and the link stands
    srv.mark("w2", 3)
    assert get(e1).host == "w2"


def test_progress_and_stops_are_told_to_the_first_host(job):
    _, first, [(c1, _), (c2, _)] = job
    c1.progress(False)
    c2.progress(True)
    assert {first.get(), first.get()} == {PeerProgress("w1", False), PeerProgress("w2", True)}
    c2.progress(True, checkpoint=True)  # a checkpoint marked on w2 reaches the lead's record
    assert first.get() == PeerProgress("w2", True, checkpoint=True)
    c1.failed("w1: stopped by SIGTERM", 143, attempt=0, stopped=True)
    assert first.get().stopped is True


def test_stacks_are_asked_of_every_host_within_a_bound(job):
    srv, _, [(c1, e1), (c2, e2)] = job
    def answer_later():
        assert get(e1) == StacksWanted()
        c1.send_stacks([{"host": "w1", "rank": 0, "name": "rank 0", "note": "", "frames": []}])

    threading.Thread(target=answer_later, daemon=True).start()
    t0 = time.monotonic()
    answers = srv.request_stacks(1.0)  # w2 never answers
    assert 1.0 <= time.monotonic() - t0 < 3.0
    assert answers == {"w1": [{"host": "w1", "rank": 0, "name": "rank 0", "note": "", "frames": []}]}
    assert get(e2) == StacksWanted()


def test_an_attempt_is_a_small_whole_number():
    assert wire.attempt({}) == 0 and wire.attempt({"n": 3}) == 3
    for bad in (-1, True, "1", 1.0, 10_001):
        with pytest.raises(wire.FrameError, match="not an attempt number"):
            wire.attempt({"n": bad})


def test_at_a_barrier_the_earliest_failure_is_the_cause_not_the_first_report(job):
    """The same rule as a running job's (decisions.root_cause): reports of earlier failures may arrive later."""
    from training_toolkit.core.errors import JobFailed

    srv, first, [(c1, _), (c2, _)] = job
    first.restart(1, "again")
    now = time.time()
    c1.failed("w1: a consequence", 69, at=now, attempt=1)
    time.sleep(0.1)
    c2.failed("w2: the cause", 66, at=now - 1.0, attempt=1)
    with pytest.raises(JobFailed, match="w2: the cause"):
        first.wait_ready(5)


# A host whose train restarted (a container restarted in its pod) --------------------------------------------


def test_a_host_whose_link_ended_joins_again_told_the_attempt_and_fits_into_the_restart(job):
    """Its old link's end is a loss (a failure); it joins again by the same rules and readies for the next attempt."""
    from training_toolkit.cluster.events import PeerLost

    srv, first, [(c1, _), (c2, e2)] = job
    c1.close()  # its train died: the link ends
    assert isinstance(first.get(), PeerLost)
    again = ControlClient(SECRET, "w1", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0,
                          introduction={"ssh_host_key": "made anew"})
    again.connect(5)
    assert again.job_attempt == (0, True)  # attempt 0 runs without it: it comes in at attempt 1
    assert srv.introductions["w1"] == {"ssh_host_key": "made anew"}  # the old run's is gone with it
    again.ready(1)  # before the first host calls the restart its loss causes: kept
    first.restart(1, "w1: left the job")
    assert get(e2) == RestartCalled(1, "w1: left the job")
    c2.ready(1)
    first.wait_ready(5)
    srv.release()
    again.wait_go(5, 1)
    c2.wait_go(5, 1)
    again.close()


def test_a_hosts_introduction_is_stored_before_its_welcome_is_sent(job, monkeypatch):
    """A reader right after the welcome finds the introduction: the server stores it, then sends (seen failing
    under load; here the welcome's send is followed by a forced delay, in which the old order had not stored it)."""
    from training_toolkit.cluster.link import Link

    srv, first, [(c1, _), _] = job
    send_raw = Link.send_raw

    def slow_after_welcome(link, message):
        send_raw(link, message)
        if message.get("t") == "welcome":
            time.sleep(0.5)  # the server's thread is held right after the welcome went out

    monkeypatch.setattr(Link, "send_raw", slow_after_welcome)
    c1.close()
    first.get()
    again = ControlClient(SECRET, "w1", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0,
                          introduction={"ssh_host_key": "made anew"})
    again.connect(5)
    try:
        assert srv.introductions["w1"] == {"ssh_host_key": "made anew"}
    finally:
        again.close()


def test_a_host_joining_during_a_restarts_barrier_is_told_that_attempt_not_started(job):
    srv, first, [(c1, _), (c2, _)] = job
    c1.close()
    first.get()
    first.restart(1, "w1: left the job")
    again = ControlClient(SECRET, "w1", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0)
    again.connect(5)
    assert again.job_attempt == (1, False)
    again.close()


def test_a_host_that_does_not_come_back_is_named_as_such_at_the_barrier(job):
    srv, first, [(c1, _), (c2, _)] = job
    c1.close()
    first.get()
    first.restart(1, "w1: left the job")
    c2.ready(1)
    with pytest.raises(ClusterError, match=r"hosts not ready within 0.5 s \(left the job and did not join again: w1\)"):
        first.wait_ready(0.5)


def test_a_live_hosts_seat_is_not_taken_by_a_second_claimant_after_it_said_ready(job):
    srv, _, _ = job
    twin = ControlClient(SECRET, "w1", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0)
    with pytest.raises(ClusterError, match="'w1' has joined already"):
        twin.connect(2)


def test_a_job_the_platform_restarted_starts_at_its_attempt():
    events = SimpleQueue()
    srv = ControlServer(SECRET, ["w1"], free_port(), events, bind="127.0.0.1", heartbeat_s=0.1, timeout_s=2.0,
                        first_attempt=2)
    srv.start()
    first = FirstHost(srv, events, attempt=2)
    c = ControlClient(SECRET, "w1", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0)
    try:
        c.connect(5)
        assert c.job_attempt == (2, False)
        c.ready(2)
        first.wait_ready(5)
        srv.release()
        c.wait_go(5, 2)
    finally:
        c.close()
        srv.close()


def test_the_welcomes_attempt_is_signed():
    """A welcome whose attempt was changed on the way fails its check, as any other field would."""
    good = {"n": 1, "go": True}
    key = b"k" * 32
    signed = wire.mac(key, *wire.welcome_signed("job", {}, good, ["a"]))
    assert wire.verify(key, signed, *wire.welcome_signed("job", {}, good, ["a"]))
    assert not wire.verify(key, signed, *wire.welcome_signed("job", {}, {"n": 0, "go": False}, ["a"]))
    assert wire.job_attempt({"at": good}) == (1, True)
    for bad in (None, {"n": 1}, {"n": -1, "go": False}, {"n": 1, "go": 1}, {"n": 1, "go": True, "x": 0}):
        with pytest.raises(wire.FrameError):
            wire.job_attempt({"at": bad})


def test_a_rejoined_host_that_fails_before_the_restart_is_called_fails_that_restarts_barrier(job):
    from training_toolkit.cluster.events import PeerLost
    from training_toolkit.core.errors import JobFailed

    srv, first, [(c1, _), (c2, _)] = job
    c1.close()
    assert isinstance(first.get(), PeerLost)
    again = ControlClient(SECRET, "w1", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0)
    again.connect(5)
    again.failed("w1: its code did not install", 66, attempt=1)  # the attempt it came in at
    assert first.get().attempt == 1
    first.restart(1, "w1: left the job")
    c2.ready(1)
    with pytest.raises(JobFailed, match="w1: its code did not install"):
        first.wait_ready(5)
    again.close()


def test_a_restarts_barrier_with_spares_waits_only_for_the_linked_hosts_and_the_go_names_the_active_ones():
    """A host lost before a restart's barrier is not waited for, nor a failure (``alive_only``); every host's go
    carries the attempt's active hosts, as the first host chose them."""
    hosts = ("m", "w1", "w2", "w3")
    events = SimpleQueue()
    srv = ControlServer(SECRET, hosts[1:], free_port(), events, bind="127.0.0.1", heartbeat_s=0.1, timeout_s=2.0,
                        hosts=hosts)
    srv.start()
    first = FirstHost(srv, events)
    clients = {}
    try:
        for host in hosts[1:]:
            c = ControlClient(SECRET, host, "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0)
            c.connect(5)
            c.hosts = hosts  # what Membership takes from the welcome
            clients[host] = c
            c.ready(0)
        assert first.wait_ready(5) == frozenset(hosts)
        srv.release(Attempt(0, ("m", "w1", "w2"), ("w3",)))
        assert {h: c.wait_go(5, 0) for h, c in clients.items()} == {h: ("m", "w1", "w2") for h in hosts[1:]}
        clients["w1"].close()  # w1 is lost: its seat goes to the spare w3
        assert first.get().host == "w1"
        first.restart(1, "w1: left the job")
        for host in ("w2", "w3"):
            clients[host].ready(1)
        alive = first.wait_ready(5, alive_only=True)  # no failure for w1's loss, and no wait for it
        assert alive == frozenset({"m", "w2", "w3"})
        assert "w1" in first.why
        srv.release(Attempt(1, ("m", "w3", "w2")))
        assert clients["w2"].wait_go(5, 1) == clients["w3"].wait_go(5, 1) == ("m", "w3", "w2")
    finally:
        for c in clients.values():
            c.close()
        srv.close()


def test_every_go_carries_every_seated_hosts_introduction():
    """Each worker learns every other host's introduction (MPI's keys for tree spawn) from the go, not only the
    first host's; a host that rejoined with a new introduction is in the next go with it.  Large enough for
    a thousand hosts' keys: a go is read up to the welcome's limit, not a plain frame's."""
    from training_toolkit.cluster.events import PeerLost

    hosts = ("m", "w1", "w2")
    events = SimpleQueue()
    srv = ControlServer(SECRET, hosts[1:], free_port(), events, bind="127.0.0.1", heartbeat_s=0.1,
                        timeout_s=2.0, hosts=hosts, introduction={"k": "first"})
    srv.start()
    first = FirstHost(srv, events)
    big = "x" * 4000  # two of these per host in MPI's keys would be 8 KB; 4 KB is the longest value allowed
    clients = {}
    try:
        for host in hosts[1:]:
            c = ControlClient(SECRET, host, "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0,
                              introduction={"k": f"{host}-0", "pad": big})
            c.connect(5)
            c.hosts = hosts
            clients[host] = c
            c.ready(0)
        first.wait_ready(5)
        assert clients["w1"].peers == {}  # nothing before the go
        srv.release()
        for c in clients.values():
            c.wait_go(5, 0)
            assert c.peers == {h: {"k": f"{h}-0", "pad": big} for h in hosts[1:]}
        clients["w2"].close()  # its train died: the link ends
        assert isinstance(first.get(), PeerLost)
        again = ControlClient(SECRET, "w2", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0,
                              introduction={"k": "w2-1"})
        again.connect(5)
        again.hosts = hosts
        clients["w2"] = again
        again.ready(1)
        first.restart(1, "w2: left the job")
        clients["w1"].ready(1)
        first.wait_ready(5)
        srv.release()
        for c in clients.values():
            c.wait_go(5, 1)
            assert c.peers == {"w1": {"k": "w1-0", "pad": big}, "w2": {"k": "w2-1"}}
    finally:
        for c in clients.values():
            c.close()
        srv.close()


def test_without_spares_a_loss_during_a_restarts_barrier_is_still_the_jobs_failure():
    hosts = ("m", "w1")
    events = SimpleQueue()
    srv = ControlServer(SECRET, hosts[1:], free_port(), events, bind="127.0.0.1", heartbeat_s=0.1,
                        timeout_s=2.0, hosts=hosts)
    srv.start()
    first = FirstHost(srv, events)
    c = ControlClient(SECRET, "w1", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1, timeout_s=2.0)
    try:
        c.connect(5)
        c.ready(0)
        first.wait_ready(5)
        srv.release()
        first.restart(1, "boom")
        c.close()
        with pytest.raises(JobFailed, match="w1: left the job"):
            first.wait_ready(5)
    finally:
        c.close()
        srv.close()
