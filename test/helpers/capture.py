"""A listener on a local cluster's bridge: every frame any host sends, and what they carry, decoded.

``Capture(netns_path)`` opens an AF_PACKET socket *inside* the network namespace (the
bridge's, ``on_bridge(cluster)``: every host's traffic crosses it) from a thread of
this process (``setns`` moves that thread only), so no capture process is left to clean
up.  ``segments()`` lists the IPv4 TCP segments with a payload seen so far, for attacks
that replay what a host sent.  ``streams()`` reassembles each TCP direction by sequence number (each frame is
seen on the host's port and on the bridge: duplicates collapse), and ``findings()``
looks for byte strings in every stream, in every UDP payload, and in every zlib stream
found inside them, inflated: Open MPI compresses its launch messages, so a search of
the raw bytes alone would miss what they carry.
"""

from __future__ import annotations

import ctypes
import os
import select
import socket
import struct
import threading
import zlib
from collections.abc import Iterable

ETH_P_ALL = 0x0003
CLONE_NEWNET = 0x40000000
_ZLIB_HEADERS = {b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda"}


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def packet_socket_in(netns_path: str) -> socket.socket:
    """An AF_PACKET socket of every interface in that namespace; this thread's namespace is left as it was."""
    result: dict[str, object] = {}

    def open_there() -> None:
        try:
            with open(netns_path, "rb") as target, open("/proc/thread-self/ns/net", "rb") as own:
                _setns(target.fileno())
                try:
                    result["sock"] = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                finally:
                    _setns(own.fileno())
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=open_there)  # a thread of its own: a failed return leaves no thread astray
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["sock"]  # type: ignore[return-value]


class Capture:
    """Frames on every interface of a namespace, from start() to stop()."""

    def __init__(self, netns_path: str):
        self.netns_path = netns_path
        self.frames: list[bytes] = []
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Capture:
        self._sock = packet_socket_in(self.netns_path)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self._thread = threading.Thread(target=self._read, name="capture", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.05)
            if ready:
                frame, address = self._sock.recvfrom(65535)
                if address[2] != socket.PACKET_OUTGOING:  # each frame once per interface it arrives on
                    self.frames.append(frame)

    def stop(self) -> list[bytes]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        return self.frames

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def on_bridge(cluster) -> Capture:
    """A capture of everything that crosses a local cluster's bridge (not started)."""
    return Capture(cluster.bridge_netns)


def segments(frames: Iterable[bytes]) -> list[dict]:
    """IPv4 TCP segments with a payload: ``{"src", "dst", "sport", "dport", "payload"}`` each, in order."""
    found = []
    for frame in list(frames):
        parsed = _ip_payload(frame)
        if parsed is None or parsed[0] != socket.IPPROTO_TCP or len(parsed[1]) != 4 or len(parsed[3]) < 20:
            continue
        _protocol, source, destination, tcp = parsed
        sport, dport = struct.unpack("!HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4:]
        if payload:
            found.append({"src": socket.inet_ntoa(source), "dst": socket.inet_ntoa(destination),
                          "sport": sport, "dport": dport, "payload": payload})
    return found


def _ip_payload(frame: bytes) -> tuple[int, bytes, bytes, bytes] | None:
    """(protocol, source, destination, payload) of an IPv4 or IPv6 frame (VLAN tags skipped), else None."""
    offset, ethertype = 14, struct.unpack("!H", frame[12:14])[0] if len(frame) >= 14 else 0
    while ethertype == 0x8100 and len(frame) >= offset + 4:
        ethertype, offset = struct.unpack("!H", frame[offset + 2:offset + 4])[0], offset + 4
    packet = frame[offset:]
    if ethertype == 0x0800 and len(packet) >= 20:
        header = (packet[0] & 0x0F) * 4
        total = struct.unpack("!H", packet[2:4])[0]
        return packet[9], packet[12:16], packet[16:20], packet[header:total]
    if ethertype == 0x86DD and len(packet) >= 40:
        length = struct.unpack("!H", packet[4:6])[0]
        return packet[6], packet[8:24], packet[24:40], packet[40:40 + length]
    return None


def streams(frames: Iterable[bytes]) -> dict[tuple, bytes]:
    """Every TCP direction's bytes in order (by sequence number), and every UDP datagram, keyed by flow."""
    segments: dict[tuple, dict[int, bytes]] = {}
    datagrams: dict[tuple, bytes] = {}
    for frame in frames:
        parsed = _ip_payload(frame)
        if parsed is None:
            continue
        protocol, source, destination, payload = parsed
        if protocol == 6 and len(payload) >= 20:
            sport, dport, seq = struct.unpack("!HHI", payload[:8])
            data = payload[(payload[12] >> 4) * 4:]
            if data:
                segments.setdefault(("tcp", source, sport, destination, dport), {})[seq] = data
        elif protocol == 17 and len(payload) >= 8:
            sport, dport = struct.unpack("!HH", payload[:4])
            key = ("udp", source, sport, destination, dport)
            datagrams[key] = datagrams.get(key, b"") + payload[8:]
    out = dict(datagrams)
    for key, by_seq in segments.items():
        ordered, end = [], None
        for seq in sorted(by_seq):
            data = by_seq[seq]
            if end is not None and seq < end:
                data = data[end - seq:]  # retransmitted or overlapping
            ordered.append(data)
            end = seq + len(by_seq[seq]) if end is None else max(end, seq + len(by_seq[seq]))
        out[key] = b"".join(ordered)
    return out


def inflated(data: bytes) -> list[bytes]:
    """Every zlib stream found anywhere in ``data``, inflated (as far as it goes)."""
    found = []
    for i in range(len(data) - 1):
        if data[i:i + 2] in _ZLIB_HEADERS:
            inflater = zlib.decompressobj()
            try:
                text = inflater.decompress(data[i:], 1 << 24)
            except zlib.error:
                continue
            if text:
                found.append(text)
    return found


def findings(frames: Iterable[bytes], needles: Iterable[bytes]) -> dict[bytes, list[str]]:
    """For each needle, where it was seen: "raw" or "zlib" in which flow; an empty list where nowhere."""
    needles = [n for n in needles if n]
    seen: dict[bytes, list[str]] = {n: [] for n in needles}
    for key, data in streams(frames).items():
        flow = f"{key[0]} port {key[2]}->{key[4]}"
        for form, blob in [("raw", data), *(("zlib", b) for b in inflated(data))]:
            for needle in needles:
                if needle in blob:
                    seen[needle].append(f"{form} {flow}")
    return seen
