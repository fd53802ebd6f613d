"""The one reader of the process table: ``/proc``, for every place that finds processes.

Who descends from whom, in which process group, whether a process is only a
zombie, what it runs, which network namespace it is in, and whether its
environment carries a marker.  Reading ``/proc`` directly costs a few
milliseconds and no import of psutil, which matters because it happens on
every launch.

Every function reads the table as it is now and answers "gone" (None, False,
``"?"``) for a process that exits under it: a process may end between two reads.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

#: How a namespace is identified: (st_dev, st_ino) of its nsfs file.
NamespaceId = tuple[int, int]


class Seen(int):
    """A pid as a look found it, with the process's start time then: an int wherever a pid is, and
    what ``supervise.pidfd.hold`` checks the process at that pid against before it signals it."""

    start: int

    def __new__(cls, pid: int, start: int) -> Seen:
        seen = super().__new__(cls, pid)
        seen.start = start
        return seen


class Proc(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    zombie: bool
    start: int  # clock ticks after boot (field 22 of stat): with the pid, names one process for good

    @property
    def seen(self) -> Seen:
        return Seen(self.pid, self.start)


def read(pid: int) -> Proc | None:
    """One process as it is now, or None once it is gone (reaped, or never there)."""
    stat = _stat(pid)
    if stat is None:
        return None
    _pid, fields = stat
    return Proc(pid, int(fields[1]), int(fields[2]), fields[0] == b"Z", int(fields[19]))


def _file(pid: int | str, name: str) -> bytes | None:
    """``/proc/PID/NAME`` (``stat``, ``environ``, ``task/TID/children``, ...); None when it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid: int | str) -> tuple[int, list[bytes]] | None:
    """The pid and the fields after the command name of ``/proc/PID/stat`` (fields[0] is the state)."""
    stat = _file(pid, "stat")
    if stat is None:
        return None
    # the command name may hold spaces and parentheses: fields start after the last ')'
    return int(stat.split(maxsplit=1)[0]), stat[stat.rfind(b")") + 2 :].split()


def pids() -> list[int]:
    """The pid of every process now (threads are not listed)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def snapshot() -> dict[int, Proc]:
    """Every process now, by pid."""
    table = {}
    for pid in pids():
        proc = read(pid)
        if proc is not None:
            table[pid] = proc
    return table


def identity(pid: int | str = "self") -> str | None:
    """``BOOT:PIDNS:PID:START``: names one process for good (a pid is reused, a start time is not
    within a boot), for records that outlive the process; None once it is gone.  The boot and the
    PID namespace say where the pid means something: another container's pid 42 is not ours."""
    stat = _stat(pid)
    if stat is None:
        return None
    number, fields = stat
    return f"{_where()}:{number}:{int(fields[19])}"


def identity_alive(ident: str) -> bool | None:
    """Whether the process ``identity`` named still runs; None when its pid means nothing here
    (another machine, boot or PID namespace), so that nobody else's process is taken for dead."""
    where, _, rest = ident.rpartition(":")[0].rpartition(":")
    if where != _where():
        return None
    return rest.isdigit() and identity(int(rest)) == ident and alive(int(rest))


def _where() -> str:
    """This boot and this PID namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return "?"


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (a zombie has ended; only its exit status is left)."""
    proc = read(pid)
    return proc is not None and not proc.zombie


def descendants(root: int, table: dict[int, Proc] | None = None) -> list[Proc]:
    """Every process below ``root`` (zombies included), parents before their children.

    From ``table`` (a snapshot shared by several questions), else through the children files (``tree``: costs what
    the tree holds, not what the machine runs), else from a snapshot.  A process is kept only if its ``stat`` names
    a parent found before it: a pid taken by another process between the two reads is no descendant.
    """
    if table is None and _has_children_files():
        found: list[Proc] = []
        parents = {root}
        for proc in map(read, tree(root)):
            if proc is not None and proc.ppid in parents:
                found.append(proc)
                parents.add(proc.pid)
        return found
    table = snapshot() if table is None else table
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return found


def tree(root: int) -> list[int]:
    """The pids below ``root``, parents first, found through each thread's ``children`` file.

    Costs what the tree holds, not what the machine runs: for a watcher that
    looks many times a second (``cluster/guard.py``), where ``descendants``
    reads every process's ``stat`` (tens of ms on a busy machine).
    """
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            listed = _file(pid, f"task/{task}/children")
            if listed is None:
                continue
            children = [int(c) for c in listed.split()]
            found += children
            stack += children
    return found


#: A process in the middle of ``execve`` reads as an empty environment for a moment (the new
#: image's is not laid out yet): measured here in most of the forks a reader catches, for up to
#: 56 ms on this 2-core machine under a load average of 12 (50 ms was too short: a stop routine
#: missed a process being exec'd).  An empty read of a live process is tried again for this long
#: before it counts as "no marker"; only a descendant whose environment is really empty pays it.
EXEC_WINDOW_S = 0.5
_PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread (its environment is always empty)


def has_marker(pid: int, marker: bytes) -> bool:
    """Whether ``marker`` (``NAME=value``) is one of the process's environment entries."""
    deadline = None
    while True:
        environ = _file(pid, "environ")
        if environ is None:
            return False
        if environ or not _may_be_in_exec(pid):
            return marker in environ.split(b"\0")
        deadline = deadline or time.monotonic() + EXEC_WINDOW_S
        if time.monotonic() >= deadline:
            return False  # a process whose environment is really empty
        time.sleep(0.001)


def _may_be_in_exec(pid: int) -> bool:
    stat = _stat(pid)
    if stat is None:
        return False
    fields = stat[1]
    return fields[0] != b"Z" and not int(fields[6]) & _PF_KTHREAD


def with_marker(marker: bytes) -> list[Seen]:
    """Every live process whose environment holds ``marker``, read once each (a process caught in
    the middle of ``execve`` is missed: for finding long-lived processes, not for stopping a tree)."""
    found = []
    for pid in pids():
        before = read(pid)  # the start time first: the environment read after it is that process's
        environ = _file(pid, "environ")
        if environ is None:
            continue
        if before is not None and not before.zombie and marker in environ.split(b"\0"):
            found.append(before.seen)
    return sorted(found)


def marked(marker: bytes, exclude: frozenset[int] = frozenset()) -> list[Seen]:
    """Every live process of this PID namespace whose environment holds ``marker`` (one caught in
    ``execve`` is waited for, as ``has_marker`` does), each with its start time: processes of the job
    started by another parent than train (Slurm's step daemon)."""
    found = []
    for pid in pids():
        if pid in exclude or pid == os.getpid():
            continue
        before = read(pid)  # the start time first: the environment read after it is that process's
        if before is not None and not before.zombie and has_marker(pid, marker):
            found.append(before.seen)
    return found


def marked_descendants(root: int, marker: bytes, exclude: frozenset[int] = frozenset()) -> list[Seen]:
    """Live descendants of ``root`` whose environment holds ``marker`` (each with its start time, so
    that a stop signals it only if it is still the process found)."""
    return [p.seen for p in descendants(root) if not p.zombie and p.pid not in exclude and has_marker(p.pid, marker)]


def comm(pid: int) -> str:
    """The process's short name (``sleep``), or ``?`` once it is gone."""
    name = _file(pid, "comm")
    return "?" if name is None else name.decode(errors="replace").strip()


def cmdline(pid: int) -> str | None:
    """The process's command line, arguments joined by spaces; None once it is gone."""
    line = _file(pid, "cmdline")
    return None if line is None else line.replace(b"\0", b" ").decode(errors="replace").strip()


def describe(pid: int) -> str:
    """``PID NAME``, for messages about processes that had to be ended."""
    return f"{pid} {comm(pid)}"


def namespace_id(path: str | os.PathLike[str]) -> NamespaceId | None:
    """The identity of the namespace an nsfs file (``/proc/PID/ns/net``, ``/run/netns/NAME``) stands for."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def netns_of(pid: int | str) -> NamespaceId | None:
    """The network namespace of a process (``"self"`` for ours); None once it has exited, zombies included."""
    return namespace_id(f"/proc/{pid}/ns/net")


def in_network_namespaces(namespaces: set[NamespaceId] | frozenset[NamespaceId]) -> dict[int, NamespaceId]:
    """Live processes whose network namespace is one of ``namespaces``, with it (membership, never names)."""
    found: dict[int, NamespaceId] = {}
    if namespaces:
        for pid in pids():
            namespace = netns_of(pid)
            if namespace in namespaces:
                found[pid] = namespace
    return found


def _has_children_files() -> bool:
    """Whether this kernel has ``/proc/PID/task/TID/children`` (``CONFIG_PROC_CHILDREN``)."""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def has_children(pid: int) -> bool:
    """Whether any thread of the process has a child now: one small read per thread, no scan of the table.
    True when it cannot tell (a kernel without ``/proc/PID/task/TID/children``): then callers scan."""
    if not _has_children_files():
        return True
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                if f.read().strip():
                    return True
        except FileNotFoundError:
            continue  # a thread that just ended
        except OSError:
            return True
    return False


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler installed for ``signum`` (``SigCgt`` in its status); False once gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False
