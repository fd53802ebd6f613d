"""Several hosts on one Linux machine, made of namespaces as containers are: their lifecycle.

Multi-host behaviour (SSH between hosts, mpirun, the control channel, every host ending with
the same verdict) can only be tested with several hosts that have their own address, hostname
and ``/opt/ml``. Containers give that but need an engine and images; namespaces need only
root, ``ip`` (iproute2) and ``unshare``/``nsenter``/``setpriv`` (util-linux), start in a
fraction of a second and leave nothing behind: each host is a PID namespace whose init dies
with the launcher, so even a launcher killed with SIGKILL leaves nothing (``holders``).

The parts, each in its own module: names and addresses (``layout``), the bridge and the
hosts' addresses (``network``), each host's namespaces held by one process (``holders``),
ending what runs inside (``teardown``), and what the machine must have (``prerequisites``).
This module puts them together: start, run commands in a host, close.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from training_toolkit.supervise import procfs
from training_toolkit.core.errors import ClusterError, ConfigError
from training_toolkit.local import holders, layout, network, prerequisites, teardown
from training_toolkit.local.holders import EnteredProcess, Host
from training_toolkit.local.teardown import leftovers
from training_toolkit.core.log import log

__all__ = ["EnteredProcess", "Host", "NamespaceCluster", "leftovers"]

class NamespaceCluster:
    """Hosts in their own namespaces joined by a bridge, started and torn down as one unit.

    Use it as a context manager; ``close()`` also runs after a failed ``start()``, and leaves
    no namespace, process or mount of the cluster behind. The per-host directories under
    ``workdir`` are kept: they hold what the job wrote to ``/opt/ml``.

    A cluster starts once. Not thread-safe: start, use and close it from one thread, and keep
    that thread alive while the cluster runs: the hosts die with the thread that started them.
    """

    def __init__(
        self,
        names: Sequence[str],
        workdir: Path,
        *,
        subnet: str = layout.DEFAULT_SUBNET,
        tag: str | None = None,
    ) -> None:
        self._names = tuple(names)
        self._workdir = Path(workdir).absolute()
        self._network = layout.parse_subnet(subnet)
        self._tag = tag if tag is not None else layout.new_tag()
        layout.validate(self._names, self._network, self._tag)
        self._addresses = layout.host_addresses(self._network, len(self._names))
        self._hosts: tuple[Host, ...] = ()
        self._netns_ids: dict[str, procfs.NamespaceId] = {}  # host name (or "" for the switch) -> its netns
        self._ended_at: int | None = None  # boot_ticks() once a teardown left nothing running (teardown.processes_in)
        # one open file per namespace, from its start to the teardown's end: a namespace's number is not given to
        # another (another test's cluster, whose processes the teardown's scan would kill) while it is held
        self._pins: list[int] = []
        self._holders: list[subprocess.Popen[bytes]] = []  # the switch first, then one per host
        self._children: list[subprocess.Popen[Any]] = []  # started by popen(), to be reaped
        self._owns_tag = False  # True once start() has checked that nothing uses the tag
        self._nsenter = "nsenter"
        self._tools: dict[str, str] = {}

    # -- what a cluster is called -------------------------------------------------------------

    @property
    def tag(self) -> str:
        """The cluster's name, carried by the processes that hold it; unique per cluster."""
        return self._tag

    @property
    def workdir(self) -> Path:
        return self._workdir

    @property
    def hosts_file(self) -> Path:
        """The file bind-mounted over ``/etc/hosts`` in every host."""
        return self._workdir / layout.HOSTS_FILE

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
                    raise ConfigError(f"cluster {self._tag}", "host", f"{host!r} is not a host of this cluster")
                return candidate
        if not self._hosts:
            raise ClusterError(f"cluster {self._tag} is not running")
        raise ConfigError(f"cluster {self._tag}", "host", f"no host {wanted!r}; hosts: {', '.join(self._names)}")

    # -- start -------------------------------------------------------------------------------

    def __enter__(self) -> NamespaceCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Create every namespace, link and mount, then return with all hosts reachable.

        Raises ClusterError, after tearing down whatever was already made, when anything
        fails; the caller never has to clean up a half-started cluster.
        """
        if self._owns_tag:
            raise ClusterError(f"cluster {self._tag} was already started; a cluster starts once, make a new one")
        self._tools = prerequisites.require_privileges_and_tools()
        self._nsenter = self._tools["nsenter"]
        taken = holders.holding(self._tag)
        if taken:
            raise ClusterError(
                f"tag {self._tag!r} is already in use (processes {', '.join(map(str, taken))}); "
                "pass another tag or close the cluster that owns it"
            )
        self._owns_tag = True
        try:
            holders.prepare_files(self._workdir, self._names, self.hosts_file,
                                  layout.hosts_file_text(self._names, self._addresses))
            inits = self._start_holders()
            network.wire(self._tools, self._holders[0].pid, inits, self._names, self._addresses,
                         self._network.prefixlen)
            self._hosts = tuple(
                Host(name=name, address=address, root=self._workdir / name, pid=init)
                for name, address, init in zip(self._names, self._addresses, inits)
            )
        except BaseException as exc:
            self.close()
            if isinstance(exc, ClusterError):
                raise
            if isinstance(exc, Exception):
                raise ClusterError(f"starting cluster {self._tag} failed: {exc}") from exc
            raise

    def _holder_argv(self, index: int) -> list[str]:
        """The command that becomes host ``index``'s holder (a seam for failure tests)."""
        name = self._names[index]
        return holders.holder_argv(self._tools, name, layout.host_opt_ml(self._workdir, name), self.hosts_file,
                                   sys.executable)

    def _start_holders(self) -> list[int]:
        """Start the switch and every holder at once, wait for each one's "ready" within one deadline.

        Returns each host's init, in host order; the namespaces are recorded as they come up.
        """
        started = [holders.start_holder(holders.switch_argv(self._tools), self._tag)]
        self._holders.append(started[0])
        for index in range(len(self._names)):
            proc = holders.start_holder(self._holder_argv(index), self._tag)
            self._holders.append(proc)
            started.append(proc)
        deadline = time.monotonic() + network.STEP_TIMEOUT_S
        inits = []
        for name, proc in zip(("", *self._names), started):
            holders.wait_until_ready(name or "switch", proc, deadline)
            held = holders.init_of(proc) if name else proc.pid
            ident = procfs.netns_of(held)
            if ident is None or ident in {procfs.netns_of("self"), procfs.netns_of(1)}:
                # Should never happen; if it did, teardown would kill the caller's processes.
                raise ClusterError(f"host {name or 'switch'}: its network namespace is not a new one")
            self._netns_ids[name] = ident
            self._pins.append(os.open(f"/proc/{held}/ns/net", os.O_RDONLY))
            if name:
                inits.append(held)
        return inits

    # -- running commands inside a host -------------------------------------------------------

    def command(
        self, host: Host | str, argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str] | None = None
    ) -> list[str]:
        """The command line that runs ``argv`` inside ``host`` (``cwd`` is a path inside it); pure."""
        if not argv:
            raise ConfigError(f"cluster {self._tag}", "argv", "a command is needed")
        return holders.enter_argv(self._nsenter, self.host(host).pid, argv, cwd)

    @property
    def bridge_netns(self) -> str:
        """The nsfs file of the hosts' bridge's network namespace (for ``setns``, ``nsenter --net=``).

        For watching the job's network as a switch would see it (e.g. capturing on ``br0``).
        """
        if not self._hosts:
            raise ClusterError(f"cluster {self._tag} is not running")
        return network.netns_file(self._holders[0].pid)

    def popen(
        self,
        host: Host | str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        **popen_kwargs: Any,
    ) -> EnteredProcess:
        """Start ``argv`` inside ``host``, like ``subprocess.Popen``; close() kills it if it still runs.

        Signals sent through the returned Popen reach the command (see ``EnteredProcess``).  The
        command starts in a session of its own, as a container's first process does: a signal
        meant for the caller's process group (a terminal's Ctrl-C, a CI job's kill) does not
        reach it, nor nsenter, which would die of it and report the command ended.
        """
        self._check_alive(host)
        popen_kwargs.setdefault("start_new_session", True)
        proc = EnteredProcess(self.command(host, argv, cwd=cwd), env=env, **popen_kwargs)
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

        ``timeout`` is required: a command that hangs inside a namespace must not hang a test;
        at the timeout the command itself is killed, as ``subprocess.run`` would.
        """
        return holders.run_to_completion(lambda **kw: self.popen(host, argv, env=env, cwd=cwd, **kw), timeout,
                                         **run_kwargs)

    def _check_alive(self, host: Host | str) -> None:
        """Refuse to nsenter a pid that is no longer the holder (it may have been reused)."""
        target = self.host(host)
        if procfs.netns_of(target.pid) != self._netns_ids.get(target.name):
            raise ClusterError(f"host {target.name} of cluster {self._tag} is gone (init pid {target.pid})")

    # -- inspection ----------------------------------------------------------------------------

    def pids(self) -> dict[str, list[int]]:
        """Every process now in each host's network namespace (holder included), by host."""
        by_id = {self._netns_ids[name]: name for name in self._names if name in self._netns_ids}
        found: dict[str, list[int]] = {name: [] for name in self._names} if self._hosts else {}
        for pid, ident in procfs.in_network_namespaces(set(by_id)).items():
            found.setdefault(by_id[ident], []).append(pid)
        return {name: sorted(pids) for name, pids in found.items()}

    def leftovers(self) -> list[str]:
        """What of this cluster still exists; empty after a complete teardown.

        Wider than the module-level ``leftovers(tag)``: it also finds processes in the
        cluster's namespaces once their holders are gone, and mounts of the cluster's files in
        the caller's namespace.
        """
        found = leftovers(self._tag)
        found += teardown.processes_in({ident: name or "switch" for name, ident in self._netns_ids.items()},
                                       started_by=self._ended_at)
        found += [f"child process {p.pid} ({procfs.comm(p.pid)}) still running"
                  for p in self._holders + self._children if p.poll() is None]
        return sorted(set(found)) + teardown.mounts_under(self._workdir)

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill everything inside the cluster; never raises.

        Idempotent and safe on a half-started cluster. Processes are found by membership of
        the cluster's network namespaces (so daemons and their children die too, and nothing
        outside does), SIGKILLed, and waited for; with the last of them and the cluster's own open
        files on the namespaces, the kernel frees the namespaces, the bridge, the veth pairs and the
        holders' mounts. Problems are logged,
        not raised: teardown runs in ``finally`` blocks.
        """
        if not self._owns_tag:
            return
        try:
            idents = set(self._netns_ids.values()) - {procfs.netns_of("self"), procfs.netns_of(1)}
            survivors = teardown.end_everything_in(idents, self._holders + self._children)
            if survivors:
                log(f"local cluster {self._tag}: processes survived SIGKILL: {', '.join(survivors)}")
            else:
                self._ended_at = teardown.boot_ticks()
            for holder in self._holders:
                if holder.stdout is not None:
                    holder.stdout.close()
            self._holders, self._children = [], []
        except Exception as exc:  # teardown must not raise; what is left shows in leftovers()
            log(f"local cluster {self._tag}: teardown failed: {exc!r}")
        finally:
            self._hosts = ()
            for pin in self._pins:  # the namespaces' numbers may go to others from now on
                os.close(pin)
            self._pins = []

    def __repr__(self) -> str:
        state = "running" if self._hosts else "stopped"
        return f"NamespaceCluster(tag={self._tag!r}, hosts={list(self._names)!r}, {state})"

