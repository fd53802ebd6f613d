"""A cluster DNS for simulated pods: A records from a JSON file, NXDOMAIN for any other name.

Run as ``python kube_dns.py RECORDS ADDRESS LIFETIME_S`` inside a namespace host of the test's own
local cluster (never anywhere else).  ``RECORDS`` maps a fully qualified name to its addresses;
it is read again on every query, so the test adds a pod's records when its container starts and
removes them when it ends, as the endpoints controller does for a headless Service.  Search
domains and ``ndots`` are the pod's resolver's business (its resolv.conf), as in a cluster.  It
answers A queries only (anything else about a known name: no data), and stops by itself after
``LIFETIME_S``.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

A, IN = 1, 1
NOERROR, FORMERR, NXDOMAIN = 0, 1, 3


def question(packet: bytes) -> tuple[str, int, int] | None:
    """(name, qtype, end of the question) of a query, or None when it is not one we can read."""
    labels, offset = [], 12
    while offset < len(packet):
        length = packet[offset]
        offset += 1
        if length == 0:
            break
        if length & 0xC0 or offset + length > len(packet):
            return None
        labels.append(packet[offset:offset + length].decode("ascii", "replace"))
        offset += length
    if offset + 4 > len(packet):
        return None
    qtype, _ = struct.unpack("!HH", packet[offset:offset + 4])
    return ".".join(labels).lower().rstrip("."), qtype, offset + 4


def answer(packet: bytes, records: dict[str, list[str]]) -> bytes:
    ident, flags = struct.unpack("!HH", packet[:4])
    read = question(packet)
    rd = flags & 0x0100
    if read is None:
        return struct.pack("!HHHHHH", ident, 0x8000 | rd | FORMERR, 0, 0, 0, 0)
    name, qtype, end = read
    addresses = records.get(name)
    rcode = NXDOMAIN if addresses is None else NOERROR
    answers = [a for a in (addresses or []) if qtype == A]
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | rd | 0x0080 | rcode, 1, len(answers), 0, 0)
    body = packet[12:end]
    for address in answers:
        body += struct.pack("!HHHIH", 0xC00C, A, IN, 5, 4) + socket.inet_aton(address)
    return header + body


def serve(records_file: str, address: str, lifetime_s: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    sock.settimeout(0.5)
    deadline = time.monotonic() + lifetime_s
    while time.monotonic() < deadline:
        try:
            packet, peer = sock.recvfrom(512)
        except socket.timeout:
            continue
        if len(packet) < 12:
            continue
        try:
            with open(records_file, encoding="utf-8") as f:
                records = json.load(f)
        except (OSError, ValueError):
            records = {}
        sock.sendto(answer(packet, records), peer)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], float(sys.argv[3]))
