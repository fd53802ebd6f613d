"""A classic BPF socket filter that admits packets from a set of addresses only, and attaching it.

Open MPI's runtime (mpirun/orted, prterun/prted) binds its out-of-band
listeners to ``0.0.0.0`` and ``[::]`` whatever ``oob_tcp_if_include`` says
(measured on 4.1 and 5.0: the parameter only chooses the address it
publishes), and its protocol has no authentication: one replayed daemon
"connect" ends a job, one held connection stalls it (issue 17).  No
parameter binds it elsewhere, but a socket filter on the listening socket
drops every packet from an address outside the job before TCP sees it: a
SYN from an outsider never completes a handshake, and a connection accepted
from that socket inherits the filter (the kernel runs ``tcp_filter`` on
listeners too).  Classic BPF needs no privilege and no compiler.

The program reads the network header (``SKF_NET_OFF``): IPv4's source at
byte 12, IPv6's at 8.  Each allowed address is one comparison followed by
its own ``accept``, so every jump is short whatever the number of hosts.
Loopback (127/8 and ::1) is always admitted: it is this host.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from collections.abc import Iterable

# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
LD_B_ABS = 0x30  # BPF_LD | BPF_B | BPF_ABS
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
RSH_K = 0x74  # BPF_ALU | BPF_RSH | BPF_K
AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JA = 0x05  # BPF_JMP | BPF_JA
RET_K = 0x06  # BPF_RET | BPF_K
SKF_NET_OFF = -0x100000
ACCEPT, DROP = 0xFFFFFFFF, 0
MAX_INSTRUCTIONS = 4096  # BPF_MAXINSNS
SO_ATTACH_FILTER = 26

Instruction = tuple[int, int, int, int]  # (code, jt, jf, k), as struct sock_filter


def _net(offset: int) -> int:
    return (SKF_NET_OFF + offset) & 0xFFFFFFFF


def admit_only(addresses: Iterable[str]) -> list[Instruction]:
    """The program: accept packets whose source is loopback or one of ``addresses``, drop the rest.

    A ValueError names an address that is not one, or a list too long for one program.
    """
    v4: list[int] = []
    v6: list[tuple[int, int, int, int]] = [struct.unpack("!4I", ipaddress.IPv6Address("::1").packed)]
    for text in dict.fromkeys(addresses):
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an IP address") from None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped  # a v4 peer of a dual-stack socket still sends IPv4 packets
        if isinstance(address, ipaddress.IPv4Address):
            v4.append(int(address))
        else:
            v6.append(struct.unpack("!4I", address.packed))
    v4_block: list[Instruction] = [(LD_W_ABS, 0, 0, _net(12))]
    for value in dict.fromkeys(v4):
        v4_block += [(JEQ_K, 0, 1, value), (RET_K, 0, 0, ACCEPT)]
    v4_block += [(AND_K, 0, 0, 0xFF000000), (JEQ_K, 0, 1, 0x7F000000), (RET_K, 0, 0, ACCEPT), (RET_K, 0, 0, DROP)]
    v6_block: list[Instruction] = []
    for words in dict.fromkeys(v6):
        # word i matches: go on to word i+1; else skip the rest of this address's check and its accept
        for i, word in enumerate(words):
            left = 2 * (3 - i) + 1  # the remaining loads and comparisons, and the accept
            v6_block += [(LD_W_ABS, 0, 0, _net(8 + 4 * i)), (JEQ_K, 0, left, word)]
        v6_block.append((RET_K, 0, 0, ACCEPT))
    v6_block.append((RET_K, 0, 0, DROP))
    head: list[Instruction] = [
        (LD_B_ABS, 0, 0, _net(0)),  # version and header length
        (RSH_K, 0, 0, 4),
        (JEQ_K, 0, 1, 4),  # IPv4: on to the jump to its block
        (JA, 0, 0, 3),
        (JEQ_K, 0, 1, 6),  # IPv6: on to the jump to its block
        (JA, 0, 0, 1 + len(v4_block)),
        (RET_K, 0, 0, DROP),  # anything else
    ]
    program = head + v4_block + v6_block
    # head[3] jumps over head[4:7] into the v4 block, head[5] over the drop and the v4 block
    if len(program) > MAX_INSTRUCTIONS:
        raise ValueError(f"{len(v4) + len(v6) - 1} addresses need {len(program)} filter instructions, "
                         f"more than the kernel's {MAX_INSTRUCTIONS}")
    return program


def attach(sock: socket.socket, program: list[Instruction]) -> None:
    """Attach ``program`` to ``sock`` (SO_ATTACH_FILTER; the kernel copies it). OSError if refused."""
    code = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(program), ctypes.addressof(buffer))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
