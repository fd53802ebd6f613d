"""Several hosts on one Linux machine, made of network, mount and UTS namespaces.

Multi-host behaviour (SSH between hosts, mpirun, the control channel, every host ending with
the same verdict) can only be tested with several hosts that have their own address, hostname
and ``/opt/ml``. Containers give that but need an engine and images; namespaces need only
root, ``ip`` (iproute2) and ``unshare``/``nsenter`` (util-linux), start in a fraction of a
second and leave nothing behind.

Layout of one cluster with tag ``T`` (all names are per cluster, so clusters never collide)::

    netns T-br      bridge br0, ports veth1..vethN          (no address; traffic stays inside)
    netns T-h1      eth0 = peer of veth1, address .11, lo   + holder: uts, mount namespaces
    netns T-h2      eth0 = peer of veth2, address .12, lo   + holder: uts, mount namespaces

Nothing of a cluster is created in the caller's network namespace: the veth pairs are made
inside the bridge namespace, so interface names never clash with the machine's or with
another cluster's.

A *holder* is one ``sleep infinity`` per host that owns the host's UTS and mount namespaces
(its hostname; ``/opt/ml``, ``/etc/hosts`` and ``/run`` bind/tmpfs mounts). Commands run in a
host by entering the holder's namespaces with ``nsenter``; an sshd started there passes the
same namespaces on to every session it serves.

Teardown finds processes by network-namespace membership, never by name or pattern, so it
kills exactly what runs inside the cluster and nothing else on the machine.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["Host", "NamespaceCluster", "NamespaceClusterError", "leftovers"]

_log = logging.getLogger(__name__)

#: Where ``ip netns`` keeps its named namespaces (one bind mount of an nsfs file each).
NETNS_DIR = Path("/run/netns")

#: Addresses reserved for documentation (RFC 5737). A cluster's subnet must lie inside one,
#: so an address of a test cluster can never be mistaken for a real machine's.
DOCUMENTATION_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
)

#: Host addresses start at this offset in the subnet (192.0.2.11, .12, ... for a /24), which
#: keeps them recognisable and away from the network and low gateway-like addresses.
_FIRST_HOST_OFFSET = 11

_HOSTNAME_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")

#: PATH for the holders: fixed, so a caller's odd PATH cannot change what runs as root.
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Seconds a holder may take to set up its namespaces before start() gives up.
_HOLDER_TIMEOUT = 10.0
#: Seconds close() keeps killing processes that are still in a host's namespace.
_KILL_TIMEOUT = 10.0

# Run by each holder as `sh -c SCRIPT holder HOSTNAME OPT_ML_SOURCE HOSTS_FILE`, already inside
# the host's network namespace and in fresh UTS and mount namespaces with private propagation
# (so none of these mounts appear outside). Why each step:
# - hostname through /proc: it is per UTS namespace and needs no `hostname` binary;
# - /run/netns is unmounted first: the copied bind mounts of *other* namespaces would otherwise
#   keep those namespaces alive (private propagation stops their unmount from reaching this
#   copy) until this holder dies;
# - a tmpfs on /run gives the host its own /run/sshd (sshd's privilege separation directory)
#   and pid files;
# - "ready" tells start() that every mount is in place, before the holder turns into `sleep`.
_HOLDER_SCRIPT = r"""set -e
exec 2>&1
printf '%s' "$1" > /proc/sys/kernel/hostname
umount --recursive --lazy /run/netns 2>/dev/null || :
mount --bind "$2" /opt/ml
mount --bind "$3" /etc/hosts
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mkdir -m 0755 /run/sshd
echo ready
exec sleep infinity </dev/null >/dev/null 2>&1
"""

_NetnsId = tuple[int, int]  # (st_dev, st_ino) of an nsfs file: identifies a network namespace


class NamespaceClusterError(RuntimeError):
    """A local cluster could not be started or used; the message says what and why."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of a local cluster, as seen from outside it."""

    name: str
    """Hostname inside the namespace, e.g. ``algo-1``."""
    address: str
    """IPv4 address of the host's ``eth0``, e.g. ``192.0.2.11``."""
    root: Path
    """Per-host directory on the real filesystem; ``root / "opt/ml"`` is ``/opt/ml`` inside."""
    pid: int
    """Pid of the holder process whose net, mount and UTS namespaces are the host's."""

    @property
    def opt_ml(self) -> Path:
        """Where the host's ``/opt/ml`` lives on the real filesystem."""
        return self.root / "opt" / "ml"


class NamespaceCluster:
    """Hosts in network namespaces joined by a bridge, started and torn down as one unit.

    Use it as a context manager; ``close()`` also runs after a failed ``start()``, and leaves
    no namespace, process or mount of the cluster behind. The per-host directories under
    ``workdir`` are kept: they hold what the job wrote to ``/opt/ml``.

    A cluster starts once. Not thread-safe: start, use and close it from one thread.
    """

    def __init__(
        self,
        names: Sequence[str],
        workdir: Path,
        *,
        subnet: str = "192.0.2.0/24",
        tag: str | None = None,
    ) -> None:
        self._names = tuple(names)
        self._workdir = Path(workdir).absolute()
        self._network = ipaddress.ip_network(subnet)
        self._tag = tag if tag is not None else "tt-" + secrets.token_hex(4)
        _validate(self._names, self._network, self._tag)
        first = int(self._network.network_address) + _FIRST_HOST_OFFSET
        self._addresses = tuple(
            str(ipaddress.ip_address(first + i)) for i in range(len(self._names))
        )
        self._hosts: tuple[Host, ...] = ()
        self._netns_ids: dict[str, _NetnsId] = {}  # namespace name -> identity, once created
        self._holders: list[subprocess.Popen[bytes]] = []
        self._children: list[subprocess.Popen[Any]] = []  # started by popen(), to be reaped
        self._owns_tag = False  # True once start() has checked that nothing uses the tag
        self._nsenter = "nsenter"

    # -- what a cluster is called -------------------------------------------------------------

    @property
    def tag(self) -> str:
        """Prefix of every namespace of this cluster; unique per cluster."""
        return self._tag

    @property
    def workdir(self) -> Path:
        return self._workdir

    @property
    def hosts_file(self) -> Path:
        """The file bind-mounted over ``/etc/hosts`` in every host."""
        return self._workdir / "hosts"

    @property
    def hosts(self) -> tuple[Host, ...]:
        """The hosts in the order given, once started; empty before start and after close."""
        return self._hosts

    def host(self, host: Host | str) -> Host:
        """The started host with this name (or this very host), so callers may pass either."""
        wanted = host.name if isinstance(host, Host) else host
        for candidate in self._hosts:
            if candidate.name == wanted:
                if isinstance(host, Host) and host != candidate:
                    raise ValueError(f"{host!r} is not a host of cluster {self._tag}")
                return candidate
        if not self._hosts:
            raise NamespaceClusterError(f"cluster {self._tag} is not running")
        raise ValueError(
            f"no host {wanted!r} in cluster {self._tag}; hosts: {', '.join(self._names)}"
        )

    def _netns_names(self) -> list[str]:
        """Bridge namespace first: it exists before any host and goes last in teardown."""
        return [_bridge_netns(self._tag)] + [
            _host_netns(self._tag, i) for i in range(1, len(self._names) + 1)
        ]

    # -- start -------------------------------------------------------------------------------

    def __enter__(self) -> NamespaceCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Create every namespace, link and mount, then return with all hosts reachable.

        Raises NamespaceClusterError, after tearing down whatever was already made, when
        anything fails; the caller never has to clean up a half-started cluster.
        """
        if self._owns_tag:
            raise NamespaceClusterError(
                f"cluster {self._tag} was already started; a cluster starts once, make a new one"
            )
        tools = _require_privileges_and_tools()
        ip, self._nsenter = tools["ip"], tools["nsenter"]
        taken = _existing_netns(self._tag)
        if taken:
            raise NamespaceClusterError(
                f"tag {self._tag!r} is already in use (namespaces {', '.join(taken)}); "
                "pass another tag or close the cluster that owns it"
            )
        self._owns_tag = True
        try:
            self._prepare_files()
            self._create_namespaces(ip)
            self._wire_network(ip)
            self._start_holders(tools["unshare"])
        except BaseException as exc:
            self.close()
            if isinstance(exc, NamespaceClusterError):
                raise
            if isinstance(exc, Exception):
                raise NamespaceClusterError(f"starting cluster {self._tag} failed: {exc}") from exc
            raise

    def _prepare_files(self) -> None:
        """Per-host roots and the shared hosts file must exist before they are bind-mounted."""
        self._workdir.mkdir(parents=True, exist_ok=True)
        # The mount point for the per-host bind mounts; harmless on a machine without it.
        Path("/opt/ml").mkdir(parents=True, exist_ok=True)
        for name in self._names:
            opt_ml = self._workdir / name / "opt" / "ml"
            if not opt_ml.is_dir():
                opt_ml.mkdir(parents=True)
                # 0755 whatever the umask: sshd's StrictModes rejects key files below a
                # group- or world-writable directory, and /opt/ml is on that path.
                opt_ml.chmod(0o755)
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{a}\t{n}" for a, n in zip(self._addresses, self._names, strict=True)]
        self.hosts_file.write_text("\n".join(lines) + "\n")

    def _create_namespaces(self, ip: str) -> None:
        names = self._netns_names()
        batch = "".join(f"netns add {n}\n" for n in names)
        result = _run_ip([ip, "-batch", "-"], batch)
        for name in names:  # record what exists even if the batch failed half way
            ident = _netns_id(NETNS_DIR / name)
            if ident is not None:
                self._netns_ids[name] = ident
        if result.returncode != 0:
            raise NamespaceClusterError(f"creating network namespaces failed: {_output(result)}")
        own = {_proc_netns_id("self"), _proc_netns_id("1")}
        if own & set(self._netns_ids.values()):
            # Should never happen; if it did, teardown would kill the caller's processes.
            raise NamespaceClusterError("a new network namespace looks like the caller's own")

    def _wire_network(self, ip: str) -> None:
        bridge = _bridge_netns(self._tag)
        lines = ["link add br0 type bridge", "link set br0 up"]
        for i in range(1, len(self._names) + 1):
            # Created inside the bridge namespace and moved straight on: no interface of
            # the cluster ever exists in the caller's namespace.
            lines += [
                f"link add veth{i} type veth peer name eth0 netns {_host_netns(self._tag, i)}",
                f"link set veth{i} master br0",
                f"link set veth{i} up",
            ]
        result = _run_ip([ip, "-netns", bridge, "-batch", "-"], "\n".join(lines) + "\n")
        if result.returncode != 0:
            raise NamespaceClusterError(f"creating the bridge failed: {_output(result)}")
        prefix = self._network.prefixlen
        running = []
        for i, address in enumerate(self._addresses, start=1):
            batch = f"link set lo up\naddress add {address}/{prefix} dev eth0\nlink set eth0 up\n"
            argv = [ip, "-netns", _host_netns(self._tag, i), "-batch", "-"]
            running.append((i, _spawn_ip(argv, batch)))
        failures = []
        for i, proc in running:
            assert proc.stdout is not None
            with proc.stdout:
                out = proc.stdout.read()  # a few bytes at most, so reading cannot block long
            if proc.wait(timeout=_HOLDER_TIMEOUT) != 0:
                failures.append(f"{self._names[i - 1]}: {out.strip()}")
        if failures:
            raise NamespaceClusterError("configuring host addresses failed: " + "; ".join(failures))

    def _holder_argv(self, index: int, unshare: str) -> list[str]:
        """The command that becomes host ``index``'s holder (a seam for failure tests)."""
        name = self._names[index]
        return [
            self._nsenter,
            f"--net={NETNS_DIR / _host_netns(self._tag, index + 1)}",
            "--",
            unshare,
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            _HOLDER_SCRIPT,
            "holder",
            name,
            str(self._workdir / name / "opt" / "ml"),
            str(self.hosts_file),
        ]

    def _start_holders(self, unshare: str) -> None:
        """Start all holders at once, then wait for each one's "ready" within one deadline."""
        holders = []
        for index in range(len(self._names)):
            proc = subprocess.Popen(
                self._holder_argv(index, unshare),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={"PATH": _SYSTEM_PATH, "LC_ALL": "C"},
                # Own session: a Ctrl-C meant for the caller must not kill the hosts before
                # close() gets to kill what runs inside them.
                start_new_session=True,
            )
            self._holders.append(proc)
            holders.append(proc)
        deadline = time.monotonic() + _HOLDER_TIMEOUT
        hosts = []
        for index, proc in enumerate(holders):
            name = self._names[index]
            ready, output = _wait_for_ready(proc, deadline)
            if not ready:
                state = "timed out" if proc.poll() is None else f"exited with {proc.returncode}"
                said = output.strip() or "(no output)"
                raise NamespaceClusterError(
                    f"host {name}: setting up its namespaces {state}: {said}"
                )
            hosts.append(
                Host(
                    name=name,
                    address=self._addresses[index],
                    root=self._workdir / name,
                    pid=proc.pid,
                )
            )
        self._hosts = tuple(hosts)

    # -- running commands inside a host -------------------------------------------------------

    def command(
        self,
        host: Host | str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        cwd: str | os.PathLike[str] | None = None,
    ) -> list[str]:
        """The command line that runs ``argv`` inside ``host``; pure, nothing is started.

        nsenter starts the command in ``/`` of the host, not in the caller's directory, so a
        working directory is passed as ``--wdns``: it is resolved inside the host, where
        ``/opt/ml`` is the host's own.
        """
        target = self.host(host)
        if not argv:
            raise ValueError("argv must not be empty")
        prefix = [self._nsenter, f"--target={target.pid}", "--net", "--mount", "--uts"]
        if cwd is not None:
            prefix.append(f"--wdns={os.fspath(cwd)}")
        return prefix + ["--"] + [os.fspath(a) for a in argv]

    def popen(
        self,
        host: Host | str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``; ``cwd`` is a path inside the host.

        The process is the command itself (nsenter execs it), so its pid, signals and exit
        status are the command's. close() kills it if it still runs.
        """
        self._check_alive(host)
        proc = subprocess.Popen(self.command(host, argv, cwd=cwd), env=env, **popen_kwargs)
        self._children = [c for c in self._children if c.poll() is None]
        self._children.append(proc)
        return proc

    def run(
        self,
        host: Host | str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        **run_kwargs: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside ``host`` to completion, like ``subprocess.run``.

        ``timeout`` is required: a command that hangs inside a namespace must not hang a test.
        """
        self._check_alive(host)
        return subprocess.run(
            self.command(host, argv, cwd=cwd), env=env, timeout=timeout, **run_kwargs
        )

    def _check_alive(self, host: Host | str) -> None:
        """Refuse to nsenter a pid that is no longer the holder (it may have been reused)."""
        target = self.host(host)
        expected = self._netns_ids.get(_host_netns(self._tag, self._names.index(target.name) + 1))
        if _proc_netns_id(str(target.pid)) != expected:
            raise NamespaceClusterError(
                f"host {target.name} of cluster {self._tag} is gone (holder pid {target.pid})"
            )

    # -- inspection ----------------------------------------------------------------------------

    def pids(self) -> dict[str, list[int]]:
        """Every process now in each host's network namespace (holder included), by host."""
        by_id = {
            self._netns_ids[_host_netns(self._tag, i)]: name
            for i, name in enumerate(self._names, start=1)
            if _host_netns(self._tag, i) in self._netns_ids
        }
        found: dict[str, list[int]] = {name: [] for name in self._names} if self._hosts else {}
        for pid, ident in _scan_processes():
            name = by_id.get(ident)
            if name is not None:
                found.setdefault(name, []).append(pid)
        return {name: sorted(pids) for name, pids in found.items()}

    def leftovers(self) -> list[str]:
        """What of this cluster still exists; empty after a complete teardown.

        Wider than the module-level ``leftovers(tag)``: it also finds processes in namespaces
        whose name is already gone, and mounts of the cluster's files in the caller's
        namespace.
        """
        found = leftovers(self._tag)
        idents = {ident: name for name, ident in self._netns_ids.items()}
        named = {_netns_id(NETNS_DIR / n) for n in _existing_netns(self._tag)}
        for pid, ident in _scan_processes():
            if ident in idents and ident not in named:
                found.append(f"process {pid} ({_comm(pid)}) in network namespace {idents[ident]}")
        for proc in self._holders + self._children:
            if proc.poll() is None:
                found.append(f"child process {proc.pid} ({_comm(proc.pid)}) still running")
        for mount_point, root in _mounts():
            if _is_under(mount_point, self._workdir) or _is_under(root, self._workdir):
                found.append(f"mount {mount_point} (from {root})")
        return found

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill everything inside the cluster and remove its namespaces; never raises.

        Idempotent and safe on a half-started cluster. Processes are found by membership of
        the cluster's network namespaces (so daemons and their children die too, and nothing
        outside does), SIGKILLed, and waited for before the namespaces are deleted, so no
        process outlives its host's name. The holders' mounts disappear with their mount
        namespaces. Problems are logged, not raised: teardown runs in ``finally`` blocks.
        """
        if not self._owns_tag:
            return
        try:
            names = sorted(set(self._netns_ids) | set(_existing_netns(self._tag)))
            idents = set(self._netns_ids.values())
            idents |= {i for i in (_netns_id(NETNS_DIR / n) for n in names) if i is not None}
            idents -= {_proc_netns_id("self"), _proc_netns_id("1")}
            if not _kill_all_in(idents, time.monotonic() + _KILL_TIMEOUT):
                _log.warning(
                    "cluster %s: processes survived SIGKILL: %s", self._tag, self.leftovers()
                )
            for proc in self._holders + self._children:
                _reap(proc)
            for holder in self._holders:
                if holder.stdout is not None:
                    holder.stdout.close()
            self._holders, self._children = [], []
            _delete_netns(names)
        except Exception:  # teardown must not raise; what is left shows in leftovers()
            _log.exception("cluster %s: teardown failed", self._tag)
        finally:
            self._hosts = ()

    def __repr__(self) -> str:
        state = "running" if self._hosts else "stopped"
        return f"NamespaceCluster(tag={self._tag!r}, hosts={list(self._names)!r}, {state})"


def leftovers(tag: str) -> list[str]:
    """What of the cluster with this tag still exists: named namespaces, mounts, processes.

    Needs only the tag, so a test (or an operator after a crash) can check for leaks of a
    cluster object it no longer has.
    """
    found = []
    names = _existing_netns(tag)
    idents = {}
    for name in names:
        found.append(f"network namespace {name}")
        ident = _netns_id(NETNS_DIR / name)
        if ident is not None:
            idents[ident] = name
    pattern = _netns_pattern(tag)
    for mount_point, _root in _mounts():
        if Path(mount_point).parent == NETNS_DIR and pattern.match(Path(mount_point).name):
            if Path(mount_point).name not in names:
                found.append(f"mount {mount_point}")
    if idents:
        for pid, ident in _scan_processes():
            if ident in idents:
                found.append(f"process {pid} ({_comm(pid)}) in network namespace {idents[ident]}")
    return found


# -- helpers -------------------------------------------------------------------------------------


def _validate(
    names: tuple[str, ...], network: ipaddress.IPv4Network | ipaddress.IPv6Network, tag: str
) -> None:
    """Reject bad arguments before anything is created, naming the argument at fault."""
    if not names:
        raise ValueError("names: at least one host is needed")
    for name in names:
        if not isinstance(name, str) or not _HOSTNAME_RE.match(name):
            raise ValueError(f"names: {name!r} is not a valid hostname label")
        if name == "hosts":
            raise ValueError("names: 'hosts' is reserved for the shared hosts file in workdir")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"names: duplicate host names {duplicates}")
    if not any(
        network.version == doc.version and network.subnet_of(doc)  # type: ignore[arg-type]
        for doc in DOCUMENTATION_NETWORKS
    ):
        raise ValueError(
            f"subnet: {network} is not inside a documentation range "
            f"({', '.join(map(str, DOCUMENTATION_NETWORKS))})"
        )
    if _FIRST_HOST_OFFSET + len(names) >= network.num_addresses - 1:
        raise ValueError(f"subnet: {network} is too small for {len(names)} hosts")
    if not _TAG_RE.match(tag):
        raise ValueError(f"tag: {tag!r} must be 1-32 of [A-Za-z0-9_.-], starting alphanumeric")


def _bridge_netns(tag: str) -> str:
    return f"{tag}-br"


def _host_netns(tag: str, number: int) -> str:
    return f"{tag}-h{number}"


def _netns_pattern(tag: str) -> re.Pattern[str]:
    """Exactly this cluster's names: tag ``a`` must not claim the namespaces of tag ``a-h1``."""
    return re.compile(rf"^{re.escape(tag)}-(?:br|h[0-9]+)$")


def _existing_netns(tag: str) -> list[str]:
    pattern = _netns_pattern(tag)
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if pattern.match(n))
    except FileNotFoundError:
        return []


def _require_privileges_and_tools() -> dict[str, str]:
    """Fail with every missing prerequisite named at once, before anything is created."""
    problems = []
    if os.geteuid() != 0:
        problems.append(
            f"needs root (network and mount namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN; "
            f"running as uid {os.geteuid()})"
        )
    tools = {}
    missing = []
    for tool, package in (
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("unshare", "util-linux"),
        ("mount", "mount"),
        ("umount", "mount"),
    ):
        path = shutil.which(tool)
        if path is None:
            missing.append(f"`{tool}` ({package})")
        else:
            tools[tool] = path
    if missing:
        problems.append(f"needs {', '.join(missing)} on PATH")
    if not Path("/proc/self/ns/net").exists():
        problems.append("needs a kernel with network namespaces (/proc/self/ns/net is missing)")
    if problems:
        raise NamespaceClusterError("NamespaceCluster " + "; ".join(problems))
    return tools


def _run_ip(argv: list[str], batch: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        input=batch,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=_HOLDER_TIMEOUT,
        env={"PATH": _SYSTEM_PATH, "LC_ALL": "C"},
    )


def _spawn_ip(argv: list[str], batch: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PATH": _SYSTEM_PATH, "LC_ALL": "C"},
    )
    assert proc.stdin is not None
    proc.stdin.write(batch)
    proc.stdin.close()
    return proc


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout or "").strip() or f"exit status {result.returncode}"


def _wait_for_ready(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bool, str]:
    """Read a holder's output until it says "ready", exits, or the deadline passes."""
    assert proc.stdout is not None
    output = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"ready\n" not in output:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return False, output.decode(errors="replace")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return False, output.decode(errors="replace")
            output += chunk
    proc.stdout.close()  # the holder's sleep writes nothing; keep no pipe open per host
    return True, output.decode(errors="replace")


def _netns_id(path: Path | str) -> _NetnsId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _proc_netns_id(pid: str) -> _NetnsId | None:
    return _netns_id(f"/proc/{pid}/ns/net")


def _scan_processes() -> Iterable[tuple[int, _NetnsId]]:
    """(pid, network namespace) of every live process; exited ones have no namespace."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            ident = _proc_netns_id(entry.name)
            if ident is not None:
                yield int(entry.name), ident


def _kill_all_in(idents: set[_NetnsId], deadline: float) -> bool:
    """SIGKILL every process in these network namespaces until none is left.

    Repeats because a process may fork between scan and kill. Uses a pidfd and checks the
    namespace again through it, so a pid reused by an unrelated process is never signalled.
    """
    me = os.getpid()
    while True:
        victims = [pid for pid, ident in _scan_processes() if ident in idents and pid != me]
        if not victims:
            return True
        for pid in victims:
            _kill_if_in(pid, idents)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def _kill_if_in(pid: int, idents: set[_NetnsId]) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except (ProcessLookupError, AttributeError, OSError):
        return
    try:
        if _proc_netns_id(str(pid)) in idents:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)


def _reap(proc: subprocess.Popen[Any]) -> None:
    """Collect a child's exit status so no zombie stays behind."""
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        # Left the cluster's namespaces (setns) and so escaped the namespace kill: it is
        # still ours, so kill it directly.
        proc.kill()
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            _log.warning("child %s does not die", proc.pid)


def _delete_netns(names: Sequence[str]) -> None:
    """Remove the names; a namespace with no process and no name is freed by the kernel."""
    present = [n for n in names if (NETNS_DIR / n).exists()]
    if not present:
        return
    ip = shutil.which("ip") or "/usr/sbin/ip"
    try:
        _run_ip([ip, "-force", "-batch", "-"], "".join(f"netns delete {n}\n" for n in present))
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("ip netns delete failed: %s", exc)
    for name in present:  # fall back to what `ip netns delete` does
        path = NETNS_DIR / name
        if path.exists():
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True, timeout=10)
            try:
                path.unlink()
            except OSError as exc:
                _log.warning("cannot remove %s: %s", path, exc)


def _mounts() -> Iterable[tuple[str, str]]:
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


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
