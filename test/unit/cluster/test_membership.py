"""The job's hosts come from the first host (issue 24): a host other than the first never keeps its own guess."""

import socket
from queue import SimpleQueue

import pytest

from training_toolkit.cluster.client import ControlClient
from training_toolkit.cluster.server import ControlServer
from training_toolkit.cluster.membership import ChannelSettings, Membership, job_hosts
from training_toolkit.core.errors import ClusterError

SECRET = b"s" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("own, current, given, hosts", [
    (("l", "w1"), "w1", ("l", "w1"), ("l", "w1")),  # the same view
    (("l", "w1"), "w1", ("l", "w0", "w1"), ("l", "w0", "w1")),  # an MPIJob worker's partial view
    (("l", "w0", "w1"), "w0", ("l", "w1", "w0"), ("l", "w1", "w0")),  # another order: the first host's
    (("l", "w1"), "w1", ("l.j.ns.svc", "w1"), ("l.j.ns.svc", "w1")),  # the first host names itself
])
def test_job_hosts_are_the_first_hosts(own, current, given, hosts):
    assert job_hosts(own, current, given) == hosts


@pytest.mark.parametrize("given, message", [
    ((), "the lead l named no hosts in its welcome"),
    (("l", "w0"), "the lead l does not list this host, w1, among the job's hosts: l, w0"),
])
def test_job_hosts_refuses_a_list_without_this_host(given, message):
    with pytest.raises(ClusterError, match=f"^{message}"):
        job_hosts(("l", "w1"), "w1", given)


def test_the_welcome_carries_the_first_hosts_list():
    srv = ControlServer(SECRET, ["w1", "w2"], free_port(), SimpleQueue(), bind="127.0.0.1", heartbeat_s=0.1,
                        hosts=("m", "w1", "w2"))
    srv.start()
    c = ControlClient(SECRET, "w2", "127.0.0.1", srv.port, SimpleQueue(), heartbeat_s=0.1)
    try:
        c.connect(5)
        assert c.hosts == ("m", "w1", "w2")
    finally:
        c.close()
        srv.close()


def test_a_seat_that_saw_part_of_the_job_takes_the_whole_from_the_first_host():
    """Two workers that each know only the first host and themselves end with the same hosts, in its order."""
    settings = ChannelSettings(free_port(), join_timeout_s=5, heartbeat_s=0.1, peer_timeout_s=10)
    hosts = ("127.0.0.1", "w0", "w1")
    first = Membership(SECRET, hosts, "127.0.0.1", settings, SimpleQueue())
    seats = [Membership(SECRET, ("127.0.0.1", name), name, settings, SimpleQueue()) for name in ("w1", "w0")]
    try:
        first.open()
        for seat in seats:
            assert seat.hosts == ("127.0.0.1", seat.current)
            seat.open()
            assert seat.hosts == hosts
        assert first.hosts == hosts
    finally:
        for seat in (*seats, first):
            seat.close()


@pytest.mark.parametrize("resolved, expected", [
    ({"l": {"10.0.0.1"}, "w0": {"10.0.0.2"}, "w1": {"10.0.0.3", "::ffff:10.0.0.3"}},
     ["10.0.0.1", "10.0.0.2", "10.0.0.3", "::ffff:10.0.0.3"]),
    ({"l": {"10.0.0.1"}, "w0": {"10.0.0.1"}, "w1": {"10.0.0.2"}}, ["10.0.0.1", "10.0.0.2"]),
    ({"l": {"10.0.0.1"}, "w0": set(), "w1": {"10.0.0.3"}}, "the job's host(s) w0 resolve to no address here"),
    ({"l": set(), "w0": set(), "w1": set()}, "the job's host(s) l, w0, w1 resolve to no address here"),
])
def test_the_jobs_addresses_name_a_host_that_does_not_resolve(monkeypatch, resolved, expected):
    """The shim's allow list and sshd's from=: a host left out would hang its ranks, so it is an error instead."""
    from training_toolkit.cluster import netaddr

    monkeypatch.setattr(netaddr, "resolve", lambda host: frozenset(resolved[host]))
    if isinstance(expected, str):
        with pytest.raises(ClusterError, match=f"^{expected}$".replace("(", r"\(").replace(")", r"\)")):
            netaddr.job_addresses(("l", "w0", "w1"))
    else:
        assert netaddr.job_addresses(("l", "w0", "w1")) == expected


def test_a_host_that_takes_the_lead_introduces_itself_with_what_it_learnt_since_it_joined():
    """An MPIJob's launcher lost: worker 0 leads, and a worker made again learns the job's ranks per host from it."""
    settings = ChannelSettings(free_port(), join_timeout_s=5, heartbeat_s=0.1, peer_timeout_s=10)
    hosts = ("127.0.0.1", "localhost", "w2")
    first = Membership(SECRET, hosts, "127.0.0.1", settings, SimpleQueue(), {"per_host": "3"})
    second = Membership(SECRET, hosts, "localhost", settings, SimpleQueue(), {"per_host": "1"})
    made_again = ControlClient(SECRET, "w2", "localhost", settings.port, SimpleQueue(), heartbeat_s=0.1)
    try:
        first.open()
        second.open()
        assert second.introductions["127.0.0.1"] == {"per_host": "3"}  # the lead's, in its welcome
        second.introduce({"per_host": "3"})  # what it took from it at its first seat
        first.close()  # the lead lost
        second.take_lead(1)
        made_again.connect(5)
        assert made_again.introduction == {"per_host": "3"}  # the new lead's welcome: the job's count, not its own
    finally:
        for seat in (made_again, second, first):
            seat.close()
