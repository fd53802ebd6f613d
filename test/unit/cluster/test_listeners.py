"""The namespace's TCP sockets as the kernel gives them (sock_diag), and the guard's decision over them (pure, exact)."""

import pytest
import os
import socket
import struct
import sys

from training_toolkit.cluster import listeners
from training_toolkit.cluster.guard import Attach, Cut, sweep_actions
from training_toolkit.cluster.listeners import ESTABLISHED, LISTEN, TcpSocket



def diag_message(family, state, local, remote, inode):
    """An ``inet_diag_msg`` as the kernel writes it (linux/inet_diag.h): 72 bytes, ports and addresses in network order."""
    def packed(address):
        raw = socket.inet_pton(family, address)
        return raw + bytes(16 - len(raw))
    return (struct.pack("=BBBB", family, state, 0, 0) + struct.pack("!HH", local[1], remote[1]) + packed(local[0])
            + packed(remote[0]) + bytes(12) + struct.pack("=IIIII", 0, 0, 0, 0, inode))  # interface, cookie; expires, queues, uid


def test_the_kernels_rows_are_read_as_it_writes_them():
    assert listeners.decode(diag_message(socket.AF_INET, LISTEN, ("127.0.0.1", 8080), ("0.0.0.0", 0), 77)) == \
        TcpSocket(77, LISTEN, ("127.0.0.1", 8080), ("0.0.0.0", 0))
    assert listeners.decode(diag_message(socket.AF_INET6, ESTABLISHED, ("::1", 80), ("fe80::1", 31337), 78)) == \
        TcpSocket(78, ESTABLISHED, ("::1", 80), ("fe80::1", 31337))
    # an IPv4 peer of a dual-stack listener is the IPv4 address the guard's rules name
    assert listeners.decode(diag_message(socket.AF_INET6, ESTABLISHED, ("::ffff:192.0.2.11", 40000),
                                         ("::ffff:192.0.2.99", 6666), 79)).remote == ("192.0.2.99", 6666)


def test_this_process_sockets_are_found_by_inode_and_fd():
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client.connect(("127.0.0.1", port))
        accepted, peer = server.accept()
        with accepted:
            fds = listeners.socket_fds(os.getpid())
            inode = {fd: i for i, fd in fds.items()}
            with listeners.diag_socket() as nl:  # a kept socket answers every request in full
                for _ in range(3):
                    rows = listeners.tcp_sockets(nl)
                    assert rows[inode[server.fileno()]] == TcpSocket(inode[server.fileno()], LISTEN, ("127.0.0.1", port),
                                                                     ("0.0.0.0", 0))
                    assert rows[inode[accepted.fileno()]] == TcpSocket(inode[accepted.fileno()], ESTABLISHED,
                                                                       ("127.0.0.1", port), peer)
                    assert inode[server.fileno()] in listeners.listening_inodes(nl)
                    assert inode[accepted.fileno()] not in listeners.listening_inodes(nl)
            assert inode[server.fileno()] in listeners.listening_inodes()  # a socket of its own when none is given
            with listeners.take(os.getpid(), server.fileno()) as copy:
                assert copy.getsockname() == ("127.0.0.1", port)
    assert listeners.socket_fds(2**22 + 1) == {}  # no such process


def row(inode, state, local, remote=("0.0.0.0", 0)):
    return TcpSocket(inode, state, local, remote)


SOCKETS = {
    10: row(10, LISTEN, ("0.0.0.0", 40000)),  # the daemon's listener
    11: row(11, LISTEN, ("::", 40001)),  # its IPv6 one
    12: row(12, ESTABLISHED, ("192.0.2.11", 40000), ("192.0.2.12", 5555)),  # a job host, accepted
    13: row(13, ESTABLISHED, ("192.0.2.11", 40000), ("192.0.2.99", 6666)),  # an outsider, accepted
    14: row(14, ESTABLISHED, ("192.0.2.11", 50000), ("192.0.2.99", 443)),  # its own outgoing connection
    15: row(15, ESTABLISHED, ("127.0.0.1", 40000), ("127.0.0.1", 7777)),  # loopback, accepted
    16: row(16, LISTEN, ("0.0.0.0", 8080)),  # a listener of another process
}
FDS = {10: 3, 11: 4, 12: 5, 13: 6, 14: 7, 15: 8}
ALLOWED = {"192.0.2.11", "192.0.2.12"}


def test_the_guard_filters_new_listeners_and_cuts_only_outsiders_accepted_connections():
    assert sweep_actions(42, SOCKETS, FDS, set(), ALLOWED) == [
        Attach(42, 3, 10, 40000), Attach(42, 4, 11, 40001), Cut(42, 6, 13, 40000, "192.0.2.99")]
    assert sweep_actions(42, SOCKETS, FDS, {10, 11, 13}, ALLOWED) == []


def test_a_rank_has_only_its_listeners_in_the_given_ports_guarded():
    assert sweep_actions(42, SOCKETS, FDS, set(), ALLOWED, ports=range(40001, 40002)) == [Attach(42, 4, 11, 40001)]
    assert sweep_actions(42, SOCKETS, FDS, set(), ALLOWED, ports=range(0)) == []


@pytest.mark.process
def test_where_the_kernel_refuses_the_guard_says_why_once_and_stops(monkeypatch):
    import errno
    import subprocess

    from training_toolkit.cluster import guard as guard_module
    from training_toolkit.cluster.guard import GuardSpec, ListenerGuard

    child = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                              "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())

        def refused(pid, fd):
            raise PermissionError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(guard_module.listeners, "take", refused)
        said = []
        import os

        guard = ListenerGuard(os.getpid(), frozenset({"192.0.2.12"}), GuardSpec(ports=frozenset({port})), say=said.append)
        guard.sweep()
        guard.sweep()
        assert guard.unavailable is not None and guard.filtered == 0
        assert said == ["listener guard: cannot reach the job's listening sockets (Operation not permitted): the job's "
                        "listeners stay open to the whole network (docs/security.md)"]
    finally:
        child.kill()
        child.wait()


@pytest.mark.process
def test_where_a_filter_may_not_be_attached_the_guard_says_why_once_and_only_cuts(monkeypatch):
    """As in a container without CAP_NET_ADMIN (measured under podman's defaults on Linux 6.18)."""
    import errno
    import os
    import subprocess

    from training_toolkit.cluster import guard as guard_module
    from training_toolkit.cluster.guard import GuardSpec, ListenerGuard

    child = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                              "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())

        def refused(sock, program):
            raise PermissionError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(guard_module.sockfilter, "attach", refused)
        said = []
        guard = ListenerGuard(os.getpid(), frozenset({"192.0.2.12"}), GuardSpec(ports=frozenset({port})), say=said.append)
        guard.sweep()
        guard.sweep()
        assert guard.cut_only and guard.unavailable is None and guard.filtered == 0
        assert list(guard._watched) == [child.pid]  # its new sockets are looked at from now on
        assert said == ["listener guard: cannot attach a socket filter (Operation not permitted; a container without "
                        "CAP_NET_ADMIN): outsiders' connections to the job's listeners are cut as they are seen "
                        "instead of refused (docs/security.md)"]
    finally:
        child.kill()
        child.wait()


def test_the_guard_is_off_with_one_line_when_a_host_does_not_resolve(monkeypatch, capsys):
    """A filter without one host's address would cut the job in two: better no guard, said once."""
    from training_toolkit.cluster import guard as guard_module
    from training_toolkit.cluster.guard import GuardSpec, start_guard

    monkeypatch.setattr(guard_module.netaddr, "resolve",
                        lambda host: frozenset({"192.0.2.11"}) if host == "algo-1" else frozenset())
    assert start_guard(GuardSpec(ports=frozenset({2222})), ["algo-1", "algo-2"]) is None
    assert capsys.readouterr().err == ("training-toolkit: listener guard off: algo-2 does not resolve here; the job's "
                                       "listeners stay open to the whole network (docs/security.md)\n")
    assert start_guard(None, ["algo-1"]) is None


def test_the_guard_looks_fast_while_listeners_appear_and_slowly_once_none_has_for_a_while():
    from training_toolkit.cluster.guard import FAST_S, SETTLE_S, SLOW_S, look_interval

    assert (FAST_S, SLOW_S, SETTLE_S) == (0.02, 0.25, 10.0)
    assert look_interval(0.0) == 0.02
    assert look_interval(9.99) == 0.02
    assert look_interval(10.0) == 0.25
    assert look_interval(3600.0) == 0.25


def test_the_guard_follows_the_hosts_names_a_host_that_resolves_to_none_keeps_its_last_addresses():
    from training_toolkit.cluster.guard import followed

    last = {"algo-1": frozenset({"192.0.2.11"}), "algo-2": frozenset({"192.0.2.12"}), "algo-3": frozenset({"192.0.2.13"})}
    found = {"algo-1": frozenset({"192.0.2.11"}), "algo-2": frozenset({"192.0.2.22"}), "algo-3": frozenset()}
    assert followed(last, found) == {"algo-1": frozenset({"192.0.2.11"}), "algo-2": frozenset({"192.0.2.22"}),
                                     "algo-3": frozenset({"192.0.2.13"})}


def test_a_pod_made_again_under_its_name_is_admitted_at_its_new_address_once_a_second_at_most(monkeypatch):
    import os

    from training_toolkit.cluster import guard as guard_module
    from training_toolkit.cluster.guard import GuardSpec, ListenerGuard

    now = [100.0]
    monkeypatch.setattr(guard_module.time, "monotonic", lambda: now[0])
    table = {"algo-1": frozenset({"192.0.2.11"}), "algo-2": frozenset({"192.0.2.12"})}
    looked = []
    said = []
    guard = ListenerGuard(os.getpid(), frozenset({"192.0.2.11", "192.0.2.12"}), GuardSpec(ports=frozenset({1})),
                          say=said.append, hosts=dict(table), resolver=lambda h: looked.append(h) or table[h])
    guard.follow()
    assert guard.allowed == frozenset({"192.0.2.11", "192.0.2.12"}) and not said and len(looked) == 2
    table["algo-2"] = frozenset({"192.0.2.22"})  # the pod replaced
    now[0] += 0.5
    guard.follow()  # within the second: not looked up
    assert len(looked) == 2 and "192.0.2.22" not in guard.allowed
    now[0] += 0.6
    program = guard._program
    guard.follow()
    assert guard.allowed == frozenset({"192.0.2.11", "192.0.2.22"}) and guard._program != program
    assert said == ["listener guard: algo-2 now at 192.0.2.22"]


def test_without_filters_a_connection_accepted_while_the_guard_looks_is_still_cut(monkeypatch):
    """Two watched processes: the second accepts an outsider's connection after the first was listed.  The table
    of the namespace's sockets is asked for after both listings, so the connection is in it, and cut; asked for at
    the first process with a new socket, it missed the connection, and the guard took it as seen for good."""
    from training_toolkit.cluster import guard as guard_module
    from training_toolkit.cluster.guard import GuardSpec, ListenerGuard

    daemon, rank = 101, 102
    rows = {1: TcpSocket(1, LISTEN, ("0.0.0.0", 7777), ("0.0.0.0", 0)),
            2: TcpSocket(2, ESTABLISHED, ("192.0.2.11", 7777), ("192.0.2.12", 5000)),  # a host of the job's
            3: TcpSocket(3, LISTEN, ("::", 31000), ("::", 0))}
    outsider = TcpSocket(4, ESTABLISHED, ("192.0.2.11", 31000), ("192.0.2.99", 6000))
    asked: list[str] = []

    def socket_fds(pid: int) -> dict[int, int]:
        asked.append(f"fds {pid}")
        if pid == daemon:
            return {1: 3, 2: 4}
        rows[4] = outsider  # accepted just now, after the daemon was listed
        return {3: 3, 4: 5}

    monkeypatch.setattr(guard_module.listeners, "socket_fds", socket_fds)
    monkeypatch.setattr(guard_module.listeners, "tcp_sockets", lambda nl: asked.append("table") or dict(rows))
    monkeypatch.setattr(guard_module.procfs, "comm", lambda pid: "python")
    guard = ListenerGuard(os.getpid(), frozenset({"192.0.2.11", "192.0.2.12"}),
                          GuardSpec(ports=frozenset({7777, 31000})), cut_only=True)
    guard.guarded.update({1, 3})  # the two listeners, found before
    guard._watched.update({daemon: set(), rank: set()})
    cut: list = []
    monkeypatch.setattr(guard, "_carry_out", cut.append)
    guard._cut_new_connections(None)
    assert asked == [f"fds {daemon}", f"fds {rank}", "table"]
    assert cut == [Cut(rank, 5, 4, 31000, "192.0.2.99")]
    assert guard._watched == {daemon: {1, 2}, rank: {3, 4}}
