"""A local host killed whole, as a node dies: every process in its namespaces, at once, with SIGKILL.

The host's namespaces stay (their holder lives on, as a dead node's address does on the network), so
the cluster tears down as usual; nothing in it runs any more: no ``train``, no rank, no sshd.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping

from training_toolkit.supervise import procfs
from training_toolkit.local.netns import NamespaceCluster
from training_toolkit.supervise import pidfd


class HostKiller:
    """Give ``before_start`` to ``run_local``; then ``kill(name)`` kills that host whole (its holder spared)."""

    def __init__(self) -> None:
        self.cluster: NamespaceCluster | None = None
        self.holders: Mapping[str, set[int]] = {}
        self.killed: dict[str, float] = {}

    def before_start(self, cluster: NamespaceCluster) -> None:
        self.cluster = cluster
        self.holders = {name: set(pids) for name, pids in cluster.pids().items()}

    def attach(self, cluster: NamespaceCluster) -> None:
        """For a cluster whose hosts already run daemons (a Slurm cluster's munged and slurmd): only each host's
        holder and its init (the holder's one child, PID 1 inside) are spared; the daemons die with the host."""
        self.cluster = cluster
        self.holders = {h.name: {h.pid} | ({proc.ppid} if (proc := procfs.read(h.pid)) else set())
                        for h in cluster.hosts}

    def kill(self, name: str, within_s: float = 10.0) -> int:
        """SIGKILL everything in host ``name`` but its namespaces' holder, until nothing is left; how many."""
        assert self.cluster is not None, "give before_start to run_local"
        self.killed[name] = time.monotonic()
        count, end = 0, time.monotonic() + within_s
        while True:
            inside = [pid for pid in self.cluster.pids().get(name, []) if pid not in self.holders.get(name, set())]
            if not inside:
                return count
            assert time.monotonic() < end, f"{name}: still running {within_s:g} s after its kill: {inside}"
            for pid in inside:
                held = pidfd.hold(pid)  # signalled only if the host still holds this very process
                if held is None:
                    continue
                if pid in self.cluster.pids().get(name, []) and held.send(signal.SIGKILL):
                    count += 1
                held.close()
            time.sleep(0.05)


def cut(cluster: NamespaceCluster, name: str, mend: bool = False) -> None:
    """Cut host ``name``'s link at the switch, as a pulled cable: it runs on, and nothing reaches it or leaves it
    (``mend``: plug it in again).

    Each host's ``eth0`` is one end of a veth pair whose other end, ``veth<i>`` (``i``: its place in the
    cluster's hosts, from 1), sits on the bridge in the switch's namespace (``local/network.py``, ``wire``).
    """
    import subprocess

    index = [host.name for host in cluster.hosts].index(name) + 1
    subprocess.run(["nsenter", f"--net={cluster.bridge_netns}", "ip", "link", "set", f"veth{index}",
                    "up" if mend else "down"], check=True, timeout=10)


def wait_for(path: os.PathLike, timeout_s: float = 120.0, at_least: int | None = None) -> None:
    """Until ``path`` exists (and, with ``at_least``, holds a number at least that)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            text = open(path).read()
            if at_least is None or (text.strip() and int(text) >= at_least):
                return
        except (FileNotFoundError, ValueError):
            pass
        assert time.monotonic() < end, f"{path}: not there within {timeout_s:g} s"
        time.sleep(0.1)


def kill_when(killer: HostKiller, counter: os.PathLike, at_least: int | None, *hosts: str,
              timeout_s: float = 240.0, cut_only: bool = False,
              then: Callable[[str], None] | None = None) -> threading.Thread:
    """Kill ``hosts`` whole once the number in ``counter`` (a rank's steps, a chief's epochs) is ``at_least`` (None:
    once it exists): in a
    thread, started; join it after the job, and check its ``errors`` (what went wrong while it waited or killed).
    ``cut_only``: cut their links instead (``cut``): they run on, cut off.  ``then``: called with each host once it
    is dead (what goes with a dead node: its files in a /tmp the test's hosts share)."""
    def go() -> None:
        wait_for(counter, timeout_s=timeout_s, at_least=at_least)
        for host in hosts:
            if cut_only:
                assert killer.cluster is not None, "give before_start to run_local"
                cut(killer.cluster, host)
            else:
                killer.kill(host)
                if then is not None:
                    then(host)

    return meanwhile(go)


def meanwhile(faults: Callable[[], None]) -> threading.Thread:
    """Run ``faults`` (what a test does to the job while it runs: waits, kills) in a thread, started; join it after
    the job, and check its ``errors`` (what went wrong in it: a wait that timed out, a kill that failed)."""
    errors: list[BaseException] = []

    def go() -> None:
        try:
            faults()
        except BaseException as exc:  # noqa: BLE001 - seen by the test after the job
            errors.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


class Replacement:
    """The platform replacing a killed host, as ``run_local``'s ``restart``: the ``train`` of each host of ``names``
    started again in the same host ``after_s`` after its loss, once.  ``as_made_again``: what the platform gives the
    new one first (a pod made again reads the platform's resource config: ``fresh_config``).  ``back[name]``: when."""

    def __init__(self, *names: str, after_s: float = 1.0, as_made_again: Callable[[str], None] | None = None) -> None:
        self.names, self.after_s, self.as_made_again = names, after_s, as_made_again
        self.back: dict[str, float] = {}

    def __call__(self, name: str, code: int) -> float | None:
        if name not in self.names or name in self.back:
            return None
        self.back[name] = time.monotonic() + self.after_s
        if self.as_made_again is not None:
            self.as_made_again(name)
        return self.after_s

    def wait_back(self, name: str, then_s: float, timeout_s: float = 240.0) -> None:
        """Until ``then_s`` after ``name``'s ``train`` was started again (time for it to join and wait)."""
        deadline = time.monotonic() + timeout_s
        while name not in self.back or time.monotonic() < self.back[name] + then_s:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} was not started again within {timeout_s} s")
            time.sleep(0.5)
