"""A listener on a local cluster's bridge: every TCP segment with a payload that crosses it, as JSON lines.

What an outsider on the job's network could read (docs/security.md's threat
model: it reads traffic).  The capture runs inside the bridge's namespace,
where the host ends of every host's veth pair are, with a raw ``AF_PACKET``
socket (no tcpdump needed): each frame is seen as it enters the bridge and
again as it leaves it, so a segment may be listed twice.

    with BridgeCapture(cluster, path) as capture:
        ...
        segments = capture.segments()   # [{"src", "dst", "sport", "dport", "payload" (bytes)}]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Run in the bridge's namespace: IPv4 TCP segments with a payload, one JSON line each, until killed.
_SNIFF = r"""
import json, socket, struct, sys
out = open(sys.argv[1], "a", buffering=1)
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))  # ETH_P_ALL, every interface
print("up", flush=True)
while True:
    frame = sock.recv(65600)
    if len(frame) < 34 or frame[12:14] != b"\x08\x00":
        continue
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != 6:
        continue
    total = struct.unpack("!H", ip[2:4])[0]
    tcp = ip[ihl:total]
    if len(tcp) < 20:
        continue
    sport, dport = struct.unpack("!HH", tcp[:4])
    payload = tcp[(tcp[12] >> 4) * 4:]
    if payload:
        out.write(json.dumps({"src": socket.inet_ntoa(ip[12:16]), "dst": socket.inet_ntoa(ip[16:20]),
                              "sport": sport, "dport": dport, "payload": payload.hex()}) + "\n")
"""


class BridgeCapture:
    """Captures on ``cluster``'s bridge from ``start()`` (or ``with``) to ``stop()``, into ``path``."""

    def __init__(self, cluster, path: Path):
        self.path = Path(path)
        self._argv = cluster.bridge_command([sys.executable, "-c", _SNIFF, str(self.path)])
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> BridgeCapture:
        self.path.touch()
        self._proc = subprocess.Popen(self._argv, stdout=subprocess.PIPE, text=True)
        if self._proc.stdout is None or self._proc.stdout.readline().strip() != "up":
            self.stop()
            raise RuntimeError("the capture in the bridge's namespace did not start")
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> BridgeCapture:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def segments(self) -> list[dict]:
        """Every segment so far (a line being written is skipped)."""
        found = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            record["payload"] = bytes.fromhex(record["payload"])
            found.append(record)
        return found
