"""Keep outsiders off the job's listeners: a socket filter on each, attached from outside the program.

Open MPI's runtime (mpirun and orted; prterun and prted in Open MPI 5) listens
on every address and trusts whoever connects, and so does every rank's BTL,
whose handshake read blocks the rank's progress until the peer sends it all;
TensorFlow's gRPC servers and torch's store listen on every address too, and
none of them authenticates a peer (docs/security.md, "Every port a job
opens").  No parameter binds them elsewhere (measured).  On each host, while
the job runs, a thread looks at this host's processes below ``train`` (every
20 ms, 250 ms once no new listener has come for 10 s: ``look_interval``): every listener of a process named in ``every_port_of`` (the
MPI runtime), and every listener on a port of ``ports`` (the BTL's range, the
frameworks' ports) of any other, so a script's own servers elsewhere are left
alone.  For each new listening socket it takes a duplicate of the descriptor
(``listeners.take``) and attaches ``sockfilter.admit_only(job addresses)``:
from then on only the job's hosts and loopback complete a connection.  A
connection accepted from an outsider before that (the listener is seconds
old at most) is shut down, which is what the daemon's own blocking read
needs to return; each outsider address is logged once.

Where the kernel refuses (no ``pidfd_getfd`` before Linux 5.6, a seccomp
profile without it, or, measured on Linux 6.18 with
``kernel.unprivileged_bpf_disabled`` 2, a container without CAP_NET_ADMIN,
which Docker's and podman's defaults do not grant), the guard says so once.
Without filters it still cuts: every new connection of a guarded process to
a guarded port from outside the job is shut down when a look sees it, which
frees a blocked handshake read, though what was sent has been read (the
accept() shim preloaded into Open MPI, runners/netshim.py, closes those
connections before Open MPI reads them).  Without
``pidfd_getfd`` it stops: only the platform's network protects these ports.

The job's addresses follow its hosts' names: when new listeners appear (an attempt's start), the
names are looked up again (at most once a second) and each host's addresses are what its name
resolves to now, its last ones where it resolves to none (``followed``): a Kubernetes pod made again
under its name has a new address, and the next attempt's listeners admit it (docs/kubernetes.md).

``sweep_actions`` and ``followed`` are the decisions, pure; ``ListenerGuard`` the shell.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from training_toolkit.supervise import procfs
from training_toolkit.cluster import listeners, netaddr, sockfilter
from training_toolkit.cluster.listeners import ESTABLISHED, LISTEN, TcpSocket
from training_toolkit.core.log import log

#: Looks are ``FAST_S`` apart until ``SETTLE_S`` after the last new listener, then ``SLOW_S``: listeners
#: appear at launch (mpirun, the daemons, each rank's MPI_Init, a framework's server), and a job that
#: trains for hours with none new should not pay 50 looks a second on every host (0.9 % of a core each,
#: measured; at 64 namespace hosts on one machine, a third of the toolkit's CPU).
FAST_S = 0.02
SLOW_S = 0.25
SETTLE_S = 10.0


def look_interval(since_new_s: float) -> float:
    """Seconds to the next look, ``since_new_s`` after the last look that found a new listener."""
    return FAST_S if since_new_s < SETTLE_S else SLOW_S


#: The names (``/proc/PID/comm``) of Open MPI's runtime processes, 4.x and 5.x.
RUNTIME = frozenset({"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "prte"})


@dataclass(frozen=True)
class Attach:
    pid: int
    fd: int
    inode: int
    port: int


@dataclass(frozen=True)
class Cut:
    pid: int
    fd: int
    inode: int
    port: int
    peer: str


def sweep_actions(pid: int, sockets: Mapping[int, TcpSocket], fds: Mapping[int, int], guarded: Collection[int],
                  allowed: Collection[str], ports: Container[int] | None = None) -> list[Attach | Cut]:
    """What to do about one process's sockets: filter its new listeners, cut outsiders' accepted connections.

    ``fds``: the process's socket descriptors (inode -> fd); ``sockets``: its
    namespace's TCP table (inode -> row); ``guarded``: inodes already filtered;
    ``ports``: the listeners' ports to guard (None: all).  An accepted
    connection is one on the local port of a guarded listener; the process's
    own outgoing connections are never touched.
    """
    actions: list[Attach | Cut] = []
    mine = {inode: sockets[inode] for inode in fds if inode in sockets}
    chosen = {row.local[1] for row in mine.values() if row.state == LISTEN and (ports is None or row.local[1] in ports)}
    for inode, row in sorted(mine.items()):
        if row.state == LISTEN and row.local[1] in chosen and inode not in guarded:
            actions.append(Attach(pid, fds[inode], inode, row.local[1]))
        elif (row.state == ESTABLISHED and row.local[1] in chosen and inode not in guarded
              and not netaddr.is_loopback(row.remote[0]) and row.remote[0] not in allowed):
            actions.append(Cut(pid, fds[inode], inode, row.local[1], row.remote[0]))
    return actions


def followed(last: Mapping[str, frozenset[str]], found: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """Each host's addresses: what its name resolves to now (``found``), else its ``last`` ones."""
    return {host: found.get(host) or addresses for host, addresses in last.items()}


@dataclass(frozen=True)
class GuardSpec:
    """Which listeners of a job's processes a runner has guarded (``RunnerSpec.guard``)."""

    ports: Container[int] = ()  # on any process below train
    every_port_of: frozenset[str] = frozenset()  # every listener of processes with these names
    # the job's processes that are not below train (MPI through Slurm: a worker's daemon, under Slurm's step
    # daemon), each with everything below it
    roots: Callable[[], Iterable[int]] | None = None


@dataclass
class ListenerGuard:
    """Filters the selected listeners on this host until ``stop()``; ``start()`` runs it in a thread.

    ``root``: the process whose descendants are watched (``train``);
    ``allowed``: the job's hosts' addresses; ``hosts``: each host's, followed by name (``resolver``) as new
    listeners appear (``follow``).
    """

    root: int
    allowed: frozenset[str]
    spec: GuardSpec
    say: Callable[[str], None] = log
    hosts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    resolver: Callable[[str], frozenset[str]] = netaddr.resolve
    _followed_at: float = float("-inf")
    guarded: set[int] = field(default_factory=set)  # inodes filtered, or cut
    filtered: int = 0
    unavailable: str | None = None  # why the kernel refused, once it did
    cut_only: bool = False  # filters refused (no CAP_NET_ADMIN): outsiders' connections are cut as they are seen
    _told: set[str] = field(default_factory=set)
    _seen: set[int] = field(default_factory=set)  # listening inodes already looked at, guarded or not
    _watched: dict[int, set[int]] = field(default_factory=dict)  # cut_only: pid -> its socket inodes last seen
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._program = sockfilter.admit_only(sorted(self.allowed))  # ValueError: a bad address, before anything

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="listener-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_new = time.monotonic()  # the job's launch is about to add listeners
        with listeners.diag_socket() as nl:
            while self.unavailable is None and not self._stop.is_set():
                if self.sweep(nl):
                    last_new = time.monotonic()
                self._stop.wait(look_interval(time.monotonic() - last_new))

    def sweep(self, nl: socket.socket | None = None) -> bool:
        """One look: filter new listeners of the job's processes, cut outsiders on them.  Whether one was new.

        The namespace's listening sockets (this process's namespace, which the
        job's processes share) are asked for first: only when one was not seen
        before are the processes below ``root`` looked at, to find whose it is,
        and the TCP table read.  A quiet job costs two netlink requests per look.
        """
        if self.unavailable is not None:
            return False
        if nl is None:
            with listeners.diag_socket() as fresh:
                return self.sweep(fresh)
        if self.cut_only:
            self._cut_new_connections(nl)
        new = listeners.listening_inodes(nl) - self._seen
        if not new:
            return False
        self.follow()
        table = listeners.tcp_sockets(nl)
        for pid in self._pids():
            fds = listeners.socket_fds(pid)
            if new.isdisjoint(fds):
                continue
            ports = None if procfs.comm(pid) in self.spec.every_port_of else self.spec.ports
            for action in sweep_actions(pid, table, fds, self.guarded, self.allowed, ports):
                self._carry_out(action)
                if self.unavailable is not None:
                    return True
        self._seen |= new
        return True

    def follow(self) -> None:
        """The hosts' names looked up again (at most once a second): a host's new address is admitted from now on."""
        if not self.hosts or time.monotonic() - self._followed_at < 1.0:
            return
        self._followed_at = time.monotonic()
        hosts = followed(self.hosts, {host: self.resolver(host) for host in self.hosts})
        allowed = frozenset().union(*hosts.values())
        if allowed != self.allowed:
            self._program = sockfilter.admit_only(sorted(allowed))
            moved = sorted(h for h in hosts if hosts[h] != self.hosts[h])
            self.say(f"listener guard: {', '.join(moved)} now at {', '.join(sorted(allowed - self.allowed))}")
            self.allowed = allowed
        self.hosts = hosts

    def _pids(self) -> list[int]:
        """The processes below train, and below the spec's other roots (in order, once each)."""
        found = procfs.tree(self.root)
        seen = set(found)
        if self.spec.roots is not None:
            for root in self.spec.roots():
                if root not in seen:  # a root below another (MPI's ranks' parents, below their daemon): walked once
                    below = [root, *procfs.tree(root)]
                    found += below
                    seen.update(below)
        return list(dict.fromkeys(found))

    def _carry_out(self, action: Attach | Cut) -> None:
        try:
            sock = listeners.take(action.pid, action.fd)
        except ProcessLookupError:
            return  # it ended meanwhile
        except OSError as exc:
            if exc.errno == errno.EBADF:  # the descriptor closed meanwhile
                return
            self._refused(f"cannot reach the job's listening sockets ({exc.strerror or exc})")
            return
        try:
            if isinstance(action, Attach):
                if not self.cut_only:
                    try:
                        sockfilter.attach(sock, self._program)
                        self.filtered += 1
                    except OSError as exc:
                        if exc.errno not in (errno.EPERM, errno.EACCES):  # measured: it wants CAP_NET_ADMIN
                            raise
                        self.cut_only = True
                        self.say(f"listener guard: cannot attach a socket filter ({exc.strerror}; a container "
                                 f"without CAP_NET_ADMIN): outsiders' connections to the job's listeners are cut "
                                 f"as they are seen instead of refused (docs/security.md)")
                if self.cut_only:
                    self._watched.setdefault(action.pid, set())
            else:
                sock.shutdown(2)  # SHUT_RDWR: the daemon's read returns, it drops the connection
                if action.peer not in self._told:
                    self._told.add(action.peer)
                    self.say(f"listener guard: cut a connection from {action.peer} to port {action.port} of "
                             f"{procfs.comm(action.pid)} (not a host of the job)")
        except OSError:
            pass  # closed under us
        finally:
            sock.close()
        self.guarded.add(action.inode)


    def _cut_new_connections(self, nl: socket.socket) -> None:
        """Without filters: a new socket of a watched process is looked at, and cut if an outsider's.

        The namespace's sockets are asked for once a look, after every watched process's descriptors were listed:
        a socket listed is then in the table (or closed), so none is taken as known without being looked at (a
        table asked for before the last listing missed a connection accepted in between, for good)."""
        new: list[tuple[int, dict[int, int]]] = []
        for pid, known in list(self._watched.items()):
            fds = listeners.socket_fds(pid)
            if not fds:
                del self._watched[pid]  # it ended
            elif not fds.keys() <= known:
                new.append((pid, fds))
        if not new:
            return
        table = listeners.tcp_sockets(nl)
        for pid, fds in new:
            self._watched[pid] = set(fds)
            ports = None if procfs.comm(pid) in self.spec.every_port_of else self.spec.ports
            for action in sweep_actions(pid, table, fds, self.guarded, self.allowed, ports):
                if isinstance(action, Cut):
                    self._carry_out(action)

    def _refused(self, why: str) -> None:
        self.unavailable = f"{why}: the job's listeners stay open to the whole network (docs/security.md)"
        self.say(f"listener guard: {self.unavailable}")


def start_guard(spec: GuardSpec | None, hosts: Sequence[str]) -> ListenerGuard | None:
    """A running guard over this process's descendants for ``spec`` (None: nothing to guard, or it cannot be)."""
    if spec is None:
        return None
    resolved = {host: netaddr.resolve(host) for host in hosts}
    missing = [host for host, addresses in resolved.items() if not addresses]
    try:
        if missing:  # a filter without a host's address would cut the job in two
            raise ValueError(f"{', '.join(missing)} does not resolve here")
        guard = ListenerGuard(os.getpid(), frozenset().union(*resolved.values()), spec, hosts=resolved)
    except ValueError as exc:  # or more hosts than one filter program holds
        log(f"listener guard off: {exc}; the job's listeners stay open to the whole network (docs/security.md)")
        return None
    guard.start()
    return guard
