"""The socket filter's program, exactly, and what the kernel makes of it (test/integration/cluster/test_guard.py runs it against real peers)."""

import socket

import pytest

from training_toolkit.cluster.sockfilter import ACCEPT, DROP, admit_only, attach

NET = 0xFFF00000  # SKF_NET_OFF as the kernel reads k


def test_one_ipv4_address_exactly():
    assert admit_only(["192.0.2.12"]) == [
        (0x30, 0, 0, NET + 0), (0x74, 0, 0, 4),
        (0x15, 0, 1, 4), (0x05, 0, 0, 3),
        (0x15, 0, 1, 6), (0x05, 0, 0, 8),
        (0x06, 0, 0, DROP),
        # IPv4: the source address, the job's host, then 127/8
        (0x20, 0, 0, NET + 12), (0x15, 0, 1, 0xC000020C), (0x06, 0, 0, ACCEPT),
        (0x54, 0, 0, 0xFF000000), (0x15, 0, 1, 0x7F000000), (0x06, 0, 0, ACCEPT), (0x06, 0, 0, DROP),
        # IPv6: ::1, word by word
        (0x20, 0, 0, NET + 8), (0x15, 0, 7, 0), (0x20, 0, 0, NET + 12), (0x15, 0, 5, 0),
        (0x20, 0, 0, NET + 16), (0x15, 0, 3, 0), (0x20, 0, 0, NET + 20), (0x15, 0, 1, 1), (0x06, 0, 0, ACCEPT),
        (0x06, 0, 0, DROP),
    ]


def test_every_jump_lands_inside_the_program_and_on_a_return_at_the_end():
    program = admit_only(["192.0.2.12", "fe80::1", "2001:db8::7", "::ffff:198.51.100.3"])
    for index, (code, jt, jf, k) in enumerate(program):
        targets = [index + 1 + k] if code == 0x05 else [index + 1 + jt, index + 1 + jf] if code == 0x15 else []
        assert all(t < len(program) for t in targets), (index, program[index])
    assert program[-1] == (0x06, 0, 0, DROP)
    # an IPv4-mapped address is checked as IPv4: it arrives in IPv4 packets
    assert (0x15, 0, 1, 0xC6336403) in program


def test_addresses_are_checked_and_bounded():
    with pytest.raises(ValueError, match="'algo-2' is not an IP address"):
        admit_only(["algo-2"])
    with pytest.raises(ValueError, match="more than the kernel's 4096"):
        admit_only([f"10.{i // 256}.{i % 256}.1" for i in range(2100)])
    assert admit_only(["10.0.0.1", "10.0.0.1"]) == admit_only(["10.0.0.1"])


def test_the_kernel_takes_it_and_loopback_still_connects():
    program = admit_only(["192.0.2.12"])
    with socket.socket(socket.AF_INET6) as server:
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        server.bind(("::", 0))
        server.listen()
        attach(server, program)
        # SO_GET_FILTER: the kernel answers with the program's length in instructions as the option's length
        assert len(server.getsockopt(socket.SOL_SOCKET, 26, 8 * len(program))) == len(program)
        port = server.getsockname()[1]
        for address, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
            with socket.socket(family) as client:
                client.settimeout(5)
                client.connect((address, port))
