"""An outsider on a local cluster that attacks every port a running job opens (issue 17).

Shared by the security tests (test/integration/cluster/test_job_ports.py) and
bench/mpi_job.py's ``--ports`` figures: list every TCP listener of each host
that is not on loopback (``ss`` inside the host), then run
test/fixtures/scripts/port_outsider.py in the outsider's namespace, which holds
a connection to each and sends garbage to each, over IPv4 and IPv6 link-local.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from helpers.paths import FIXTURES
from training_toolkit.cluster.guard import RUNTIME
_LISTEN = re.compile(r'^LISTEN\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s+users:\(\("([^"]+)"')


def listeners(cluster, host: str) -> list[tuple[str, int, str]]:
    """(bound address, port, program) of every TCP listener in ``host`` not bound to loopback."""
    out = cluster.run(host, ["ss", "-Htlnp"], timeout=10, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        match = _LISTEN.match(line.strip())
        if match and match.group(1) not in ("127.0.0.1", "[::1]"):
            found.append((match.group(1), int(match.group(2)), match.group(3)))
    return found


def link_local(cluster, host: str) -> str | None:
    out = cluster.run(host, ["ip", "-6", "-o", "addr", "show", "scope", "link"], timeout=10,
                      capture_output=True, text=True).stdout
    match = re.search(r"^\d+:\s+(\S+)\s+inet6\s+(fe80::[0-9a-f:]+)/", out, re.M)
    return f"{match.group(2)}%eth0" if match else None


def mpi_host_ready(ports, with_ranks: bool) -> bool:
    programs = {program for _, _, program in ports}
    return bool(programs & set(RUNTIME)) and (not with_ranks or "python" in programs)


def targets(cluster, hosts, ready) -> list[list] | None:
    """Every (address, port, owner) to attack, once ``ready(host's listeners)`` holds for every host."""
    found = []
    for host in hosts:
        ports = listeners(cluster, host)
        if not ready(ports):
            return None
        v4, v6 = cluster.host(host).address, link_local(cluster, host)
        for port in sorted({(port, program) for _, port, program in ports}):
            found.append([v4, port[0], f"{host} {port[1]}"])
            if v6:
                found.append([v6, port[0], f"{host} {port[1]} (IPv6 link-local)"])
    return found




def start_attack(cluster, hosts, ready: Callable, workdir: Path, results_file: Path, hold_s: float,
                 attack: dict) -> None:
    """In a thread: once ``targets`` are ready, the outsider (namespace ``stranger``) attacks them.

    ``attack`` gets ``proc`` (to kill at the end) or ``error``; without targets
    within 90 s, ``results_file`` is written anyway so that the job goes on.
    """
    def run() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (found := targets(cluster, hosts, ready)) is None:
            time.sleep(0.3)
        if found is None:
            attack["error"] = f"the job's listeners never all appeared: {[listeners(cluster, h) for h in hosts]}"
            results_file.write_text("{}")
            return
        (workdir / "targets.json").write_text(json.dumps(found))
        attack["proc"] = cluster.popen("stranger", [sys.executable, str(FIXTURES / "port_outsider.py"),
                                                    str(workdir / "targets.json"), str(results_file), str(hold_s)],
                                       env={"PATH": os.environ["PATH"]})

    threading.Thread(target=run, daemon=True).start()


def stop_attack(attack: dict) -> None:
    if "proc" in attack:
        attack["proc"].kill()
        attack["proc"].wait()
