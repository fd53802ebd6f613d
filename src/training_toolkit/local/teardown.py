"""Ending what runs in a local cluster, and finding what of a cluster is left.

Processes are found by membership of the cluster's network namespaces, never
by name or pattern, so teardown kills exactly what runs inside the cluster
(daemons and their children included) and nothing else on the machine.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from training_toolkit.supervise import procfs
from training_toolkit.local import holders
from training_toolkit.supervise.stopping import Handle, stop_processes

#: Seconds teardown keeps killing processes that are still in a host's namespace.
KILL_TIMEOUT_S = 10.0


def end_everything_in(namespaces: set[procfs.NamespaceId], owned: Sequence[Handle]) -> list[str]:
    """SIGKILL every process in these network namespaces, and the processes we started for them.

    ``owned`` (the holders, commands started in hosts) are reaped through their
    handles; they may have left the namespaces (setns) and are ended all the
    same.  A pid is checked again through a pidfd before it is signalled, so a
    pid reused outside the cluster is never touched.  Returns what survived.
    """
    me = os.getpid()
    by_pid = {proc.pid: proc for proc in owned}

    def inside() -> list:
        found = [pid for pid in procfs.in_network_namespaces(namespaces) if pid != me]
        return [by_pid.get(pid, pid) for pid in found] + list(owned)

    stop_processes(inside, KILL_TIMEOUT_S, signal.SIGKILL, still_ours=lambda pid: procfs.netns_of(pid) in namespaces)
    left = [procfs.describe(pid) for pid in procfs.in_network_namespaces(namespaces) if pid != me]
    return left + [f"{proc.pid} (started in the cluster)" for proc in owned if proc.poll() is None]


def leftovers(tag: str) -> list[str]:
    """What of the cluster with this tag still exists: the processes holding it, and what runs in its hosts.

    Needs only the tag, so a test (or an operator after a crash) can check for leaks of a
    cluster object it no longer has.  A cluster's namespaces have no name: once no process
    holds them, the kernel has freed them.
    """
    holding = holders.holding(tag)
    namespaces = {procfs.netns_of(pid) for pid in holding} - {None, procfs.netns_of("self")}
    inside = set(procfs.in_network_namespaces(namespaces))  # type: ignore[arg-type]
    return ([f"process {pid} ({procfs.comm(pid)}) holding cluster {tag}" for pid in holding]
            + [f"process {pid} ({procfs.comm(pid)}) in a host of cluster {tag}" for pid in sorted(inside - set(holding))])


def boot_ticks() -> int:
    """Now, in the clock ticks after boot in which ``/proc/<pid>/stat`` gives a process's start."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def processes_in(namespaces: dict[procfs.NamespaceId, str], started_by: int | None = None) -> list[str]:
    """A line for each process in these network namespaces (given with what names them).

    ``started_by`` (``boot_ticks()`` once a teardown left nothing): only processes started by then.  The
    kernel gives a freed namespace's number to the next namespace made, so after a teardown another
    cluster's new switch or host can carry an old one's number (seen: its ``sleep``, ``ip``, ``unshare``
    named as this cluster's leftovers while clusters of other tests started); a process of this cluster
    that outlived its teardown started before it ended.
    """
    found = procfs.in_network_namespaces(set(namespaces))
    if started_by is not None:
        found = {pid: ident for pid, ident in found.items()
                 if (proc := procfs.read(pid)) is not None and proc.start <= started_by}
    return [f"process {pid} ({procfs.comm(pid)}) in network namespace {namespaces[ident]}" for pid, ident in found.items()]


def mounts_under(directory: Path) -> list[str]:
    """Mounts in the caller's namespace of, or on, anything below ``directory``."""
    return [f"mount {mount_point} (from {root})" for mount_point, root in mounts()
            if _is_under(mount_point, directory) or _is_under(root, directory)]


def mounts() -> Iterable[tuple[str, str]]:
    """(mount point, root within its filesystem) of each mount in the caller's namespace."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            yield _unescape(fields[4]), _unescape(fields[3])


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _is_under(path: str, directory: Path) -> bool:
    return path == str(directory) or path.startswith(str(directory).rstrip("/") + "/")
