"""A process's TCP sockets, read from /proc, and a duplicate of one of its descriptors (pidfd_getfd).

Used by ``guard`` to find the listeners of processes the toolkit started but
does not own the code of (Open MPI's daemons), so that it can filter them.
Everything is read in the process's own network namespace
(``/proc/PID/net/tcp``), so it holds inside containers and local clusters.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

LISTEN, ESTABLISHED = "0A", "01"  # states in /proc/net/tcp (include/net/tcp_states.h)
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_SYS_PIDFD_GETFD = 438  # the same number on every architecture Linux assigns new calls to (5.6+)


@dataclass(frozen=True)
class TcpSocket:
    inode: int
    state: str
    local: tuple[str, int]
    remote: tuple[str, int]


def parse_address(text: str) -> tuple[str, int]:
    """``0100007F:1F90`` (IPv4) or 32 hex digits and a port (IPv6), as the kernel prints them, to (address, port).

    The kernel prints each 32-bit word of the address in the machine's byte order.
    """
    hex_address, hex_port = text.split(":")
    raw = bytes.fromhex(hex_address)
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    packed = struct.pack(f"!{len(words)}I", *words)
    address = ipaddress.ip_address(packed)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return str(address), int(hex_port, 16)


def parse_table(text: str) -> list[TcpSocket]:
    """The rows of a /proc/net/tcp or tcp6 table (the header line skipped)."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        rows.append(TcpSocket(int(fields[9]), fields[3], parse_address(fields[1]), parse_address(fields[2])))
    return rows


def diag_socket() -> socket.socket:
    """A sock_diag netlink socket for ``listening_inodes``: one per guard, kept, not one per look."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)


def listening_inodes(nl: socket.socket | None = None) -> set[int]:
    """The inodes of every listening TCP socket of this process's network namespace (sock_diag netlink).

    A cheap first look, many times a second: the kernel walks only its
    listening hash, where reading /proc/net/tcp walks the whole established
    hash (about 15 ms per read on this kernel, whatever the namespace holds).
    ``nl``: a ``diag_socket()`` to ask through (a new one, closed after, when
    None); each request reads to its ``NLMSG_DONE``, so the socket is ready for
    the next.
    """
    if nl is None:
        with diag_socket() as fresh:
            return listening_inodes(fresh)
    found: set[int] = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        request = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << 10)  # states: TCP_LISTEN
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
                found.add(struct.unpack_from("=I", data, offset + 16 + 68)[0])  # inet_diag_msg.idiag_inode
                offset += (length + 3) & ~3
    return found


def tcp_sockets(pid: int) -> dict[int, TcpSocket]:
    """Every TCP socket of ``pid``'s network namespace, by inode (empty if the process is gone)."""
    found: dict[int, TcpSocket] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                text = f.read()
        except OSError:
            continue
        found.update((row.inode, row) for row in parse_table(text))
    return found


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
