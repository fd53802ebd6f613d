"""A local cluster's network: the bridge joining the hosts' network namespaces, and their addresses (``ip``).

Every namespace belongs to a process (a host's holder, the cluster's switch: see
``holders``) and has no name, so the kernel frees it, veth ends and bridge included,
when that process goes.  Nothing is created in the caller's network namespace: the
veth pairs are made inside the switch's namespace and their host ends moved straight
on, so interface names never clash with the machine's or with another cluster's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from training_toolkit.core.errors import ClusterError

#: A fixed PATH for what runs as root, so a caller's odd PATH cannot change what runs.
SYSTEM_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

#: Seconds one step of setting up (an ``ip`` batch, a host's namespaces) may take.
STEP_TIMEOUT_S = 10.0


def netns_file(pid: int) -> str:
    """The nsfs file of a process's network namespace, which ``nsenter --net=`` takes."""
    return f"/proc/{pid}/ns/net"


def wire(tools: dict[str, str], switch: int, hosts: Sequence[int], names: Sequence[str], addresses: Sequence[str],
         prefixlen: int) -> None:
    """The bridge in ``switch``'s namespace with one veth pair per host, each host's ``eth0`` up with its address.

    ``hosts``: a process in each host's network namespace (its init), in the order of ``names``.
    """
    lines = ["link add br0 type bridge", "link set br0 up"]
    for i, pid in enumerate(hosts, start=1):
        lines += [
            f"link add veth{i} type veth peer name eth0 netns {pid}",
            f"link set veth{i} master br0",
            f"link set veth{i} up",
        ]
    result = _run_ip(_in_netns(tools, switch), "\n".join(lines) + "\n")
    if result.returncode != 0:
        raise ClusterError(f"creating the bridge failed: {_output(result)}")
    running = []
    for name, pid, address in zip(names, hosts, addresses, strict=True):
        batch = f"link set lo up\naddress add {address}/{prefixlen} dev eth0\nlink set eth0 up\n"
        running.append((name, _spawn_ip(_in_netns(tools, pid), batch)))
    failures = []
    for name, proc in running:
        assert proc.stdout is not None
        with proc.stdout:
            out = proc.stdout.read()  # a few bytes at most, so reading cannot block long
        if proc.wait(timeout=STEP_TIMEOUT_S) != 0:
            failures.append(f"{name}: {out.strip()}")
    if failures:
        raise ClusterError("configuring host addresses failed: " + "; ".join(failures))


def _in_netns(tools: dict[str, str], pid: int) -> list[str]:
    return [tools["nsenter"], f"--net={netns_file(pid)}", "--", tools["ip"], "-batch", "-"]


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
