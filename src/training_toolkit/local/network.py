"""A local cluster's network: named network namespaces, the bridge joining them, host addresses (``ip``).

Nothing is created in the caller's network namespace: the veth pairs are made
inside the bridge namespace and their host ends moved straight on, so
interface names never clash with the machine's or with another cluster's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from training_toolkit import procfs
from training_toolkit.errors import ClusterError
from training_toolkit.local import layout
from training_toolkit.log import log

#: Where ``ip netns`` keeps its named namespaces (one bind mount of an nsfs file each).
NETNS_DIR = Path("/run/netns")

#: A fixed PATH for what runs as root, so a caller's odd PATH cannot change what runs.
SYSTEM_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

#: Seconds one step of setting up (an ``ip`` batch, a host's namespaces) may take.
STEP_TIMEOUT_S = 10.0


def existing_netns(tag: str) -> list[str]:
    """The named network namespaces of the cluster with this tag that exist now."""
    pattern = layout.netns_pattern(tag)
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if pattern.match(n))
    except FileNotFoundError:
        return []


def netns_id(name: str) -> procfs.NamespaceId | None:
    """The identity of a named network namespace, or None when there is no such name."""
    return procfs.namespace_id(NETNS_DIR / name)


def create_namespaces(ip: str, names: Sequence[str], created: dict[str, procfs.NamespaceId]) -> None:
    """Create the named namespaces, recording each in ``created`` (even when a later one fails)."""
    result = _run_ip([ip, "-batch", "-"], "".join(f"netns add {n}\n" for n in names))
    for name in names:
        ident = netns_id(name)
        if ident is not None:
            created[name] = ident
    if result.returncode != 0:
        raise ClusterError(f"creating network namespaces failed: {_output(result)}")
    if {procfs.netns_of("self"), procfs.netns_of(1)} & set(created.values()):
        # Should never happen; if it did, teardown would kill the caller's processes.
        raise ClusterError("a new network namespace looks like the caller's own")


def wire(ip: str, tag: str, names: Sequence[str], addresses: Sequence[str], prefixlen: int) -> None:
    """The bridge with one veth pair per host, and each host's ``eth0`` up with its address."""
    lines = ["link add br0 type bridge", "link set br0 up"]
    for i in range(1, len(names) + 1):
        lines += [
            f"link add veth{i} type veth peer name eth0 netns {layout.host_netns(tag, i)}",
            f"link set veth{i} master br0",
            f"link set veth{i} up",
        ]
    result = _run_ip([ip, "-netns", layout.bridge_netns(tag), "-batch", "-"], "\n".join(lines) + "\n")
    if result.returncode != 0:
        raise ClusterError(f"creating the bridge failed: {_output(result)}")
    running = []
    for i, address in enumerate(addresses, start=1):
        batch = f"link set lo up\naddress add {address}/{prefixlen} dev eth0\nlink set eth0 up\n"
        running.append((i, _spawn_ip([ip, "-netns", layout.host_netns(tag, i), "-batch", "-"], batch)))
    failures = []
    for i, proc in running:
        assert proc.stdout is not None
        with proc.stdout:
            out = proc.stdout.read()  # a few bytes at most, so reading cannot block long
        if proc.wait(timeout=STEP_TIMEOUT_S) != 0:
            failures.append(f"{names[i - 1]}: {out.strip()}")
    if failures:
        raise ClusterError("configuring host addresses failed: " + "; ".join(failures))


def delete_namespaces(names: Sequence[str]) -> None:
    """Remove the names; a namespace with no process and no name is freed by the kernel."""
    present = [n for n in names if (NETNS_DIR / n).exists()]
    if not present:
        return
    ip = shutil.which("ip") or "/usr/sbin/ip"
    try:
        _run_ip([ip, "-force", "-batch", "-"], "".join(f"netns delete {n}\n" for n in present))
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"ip netns delete failed: {exc}")
    for name in present:  # fall back to what `ip netns delete` does
        path = NETNS_DIR / name
        if path.exists():
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True, timeout=STEP_TIMEOUT_S)
            try:
                path.unlink()
            except OSError as exc:
                log(f"cannot remove {path}: {exc}")


def _run_ip(argv: list[str], batch: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=batch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=STEP_TIMEOUT_S, env=dict(SYSTEM_ENV))


def _spawn_ip(argv: list[str], batch: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(SYSTEM_ENV))
    assert proc.stdin is not None
    proc.stdin.write(batch)
    proc.stdin.close()
    return proc


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout or "").strip() or f"exit status {result.returncode}"
