"""The TCP sockets of this network namespace (sock_diag netlink), and a duplicate of a process's descriptor (pidfd_getfd).

Used by ``guard`` to find the listeners of processes the toolkit started but
does not own the code of (Open MPI's daemons), so that it can filter them.
Everything is asked of the kernel in the asking process's own network
namespace, which the job's processes share, so it holds inside containers and
local clusters.  Not /proc/net/tcp: reading it walks the kernel's whole
established hash and formats text, 7-15 ms per read on this kernel whatever the
namespace holds; the netlink dump of the same rows takes about 0.3 ms.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

LISTEN, ESTABLISHED = 10, 1  # TCP states (include/net/tcp_states.h)
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_SYS_PIDFD_GETFD = 438  # the same number on every architecture Linux assigns new calls to (5.6+)


@dataclass(frozen=True)
class TcpSocket:
    inode: int
    state: int
    local: tuple[str, int]
    remote: tuple[str, int]


def diag_socket() -> socket.socket:
    """A sock_diag netlink socket to ask through: one per guard, kept, not one per look."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)


def _address(raw: bytes) -> str:
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return str(address)


def decode(message: bytes) -> TcpSocket:
    """One ``inet_diag_msg`` (linux/inet_diag.h): family, state, ports (network order), addresses, inode."""
    family, state = message[0], message[1]
    sport, dport = struct.unpack_from("!HH", message, 4)
    size = 4 if family == socket.AF_INET else 16
    inode = struct.unpack_from("=I", message, 68)[0]
    return TcpSocket(inode, state, (_address(message[8:8 + size]), sport), (_address(message[24:24 + size]), dport))


def _dump(nl: socket.socket, states: int) -> Iterator[bytes]:
    """Every ``inet_diag_msg`` of the namespace's TCP sockets in ``states`` (a bit per state), IPv4 then IPv6.

    Each request reads to its ``NLMSG_DONE``, so a kept socket is ready for the next.
    """
    for family in (socket.AF_INET, socket.AF_INET6):
        request = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, states)
        header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
        nl.send(header + request)
        done = False
        while not done:
            data = nl.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < 16:
                    done = True
                    break
                yield data[offset + 16:offset + length]
                offset += (length + 3) & ~3


def listening_inodes(nl: socket.socket | None = None) -> set[int]:
    """The inodes of every listening TCP socket of this namespace: a cheap first look, many times a second.

    The kernel walks only its listening hash.  ``nl``: a ``diag_socket()`` (a
    new one, closed after, when None).
    """
    if nl is None:
        with diag_socket() as fresh:
            return listening_inodes(fresh)
    return {struct.unpack_from("=I", message, 68)[0] for message in _dump(nl, 1 << LISTEN)}


def tcp_sockets(nl: socket.socket | None = None) -> dict[int, TcpSocket]:
    """This namespace's listening and established TCP sockets, by inode (what the guard decides over)."""
    if nl is None:
        with diag_socket() as fresh:
            return tcp_sockets(fresh)
    rows = (decode(message) for message in _dump(nl, (1 << LISTEN) | (1 << ESTABLISHED)))
    return {row.inode: row for row in rows}


def socket_fds(pid: int) -> dict[int, int]:
    """``pid``'s socket descriptors: inode -> fd (empty if it is gone or not ours to read)."""
    out: dict[int, int] = {}
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for entry in entries:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(entry)
    return out


def take(pid: int, fd: int) -> socket.socket:
    """A socket object on the same open socket as ``pid``'s descriptor ``fd`` (OSError if not allowed or gone).

    ``pidfd_getfd`` needs ptrace access to ``pid``: a descendant of ours, as root,
    passes even under Yama's ``ptrace_scope`` 1.  Closing ours leaves theirs open.
    """
    pidfd = os.pidfd_open(pid)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        new = libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        if new < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
    finally:
        os.close(pidfd)
    return socket.socket(fileno=new)
