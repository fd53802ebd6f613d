"""Addresses of hosts and interfaces, read from the resolver and the kernel (no subprocess)."""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Mapping, Sequence

from training_toolkit.core.errors import ClusterError

_SIOCGIFADDR = 0x8915


def resolve(name: str) -> frozenset[str]:
    """Every address ``name`` resolves to here (empty when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return frozenset()
    return frozenset(plain(info[4][0]) for info in infos)


def host_addresses(hosts: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each of the job's hosts' addresses, in order; a ClusterError naming every host that resolves to none.

    Every host must resolve: one left out would be a host whose connections the shim closes (ranks that
    hang), or whose ssh key no host admits, so it is an error naming it instead.
    """
    found = {host: tuple(sorted(resolve(host))) for host in hosts}
    missing = [host for host, addresses in found.items() if not addresses]
    if missing:
        raise ClusterError(f"the job's host(s) {', '.join(missing)} resolve to no address here")
    return found


def job_addresses(hosts: Sequence[str]) -> list[str]:
    """Every address of the job's hosts: the only ones sshd admits a client key from, and the guard lets in."""
    return joined(host_addresses(hosts))


def joined(by_host: Mapping[str, Sequence[str]]) -> list[str]:
    """Every address of ``host_addresses``' answer, once each, sorted."""
    return sorted({address for addresses in by_host.values() for address in addresses})


def plain(address: str) -> str:
    """An IPv4-mapped IPv6 address (as a dual-stack socket reports it) in its IPv4 form."""
    return address[7:] if address.startswith("::ffff:") and "." in address else address


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of the network interface ``name`` (e.g. eth0), or None if it has none."""
    if not name or len(name) >= 16:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"
