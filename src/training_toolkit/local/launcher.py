"""Run one job on N local hosts: a namespace per host, ``train`` in each, output prefixed by host.

This is both a product feature (try a multi-host job before paying for a
cluster) and the test bed of every multi-host claim.  Each host gets its own
``/opt/ml`` (resourceconfig naming it ``current_host``), its own hostname and
address, and the job's per-job secret in its environment; the launcher
collects every host's exit code and verdict, and tears everything down, even
when the job fails or the launcher is interrupted.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

from training_toolkit.supervise import pidfd, procfs
from training_toolkit.local.job import INTERFACE, HostResult, LocalJob, host_tree, read_result
from training_toolkit.local import layout, run_loop
from training_toolkit.local.netns import EnteredProcess, NamespaceCluster
from training_toolkit.local.prefix import LinePrefixer, Pump, host_prefix, read_chunks
from training_toolkit.config.settings import JOB_SECRET
from training_toolkit.supervise.stopping import stop_processes

__all__ = ["INTERFACE", "HostResult", "LocalJob", "default_train", "host_tree", "run_local"]


def default_train() -> list[str]:
    return [str(Path(sys.executable).with_name("train"))]


def base_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What every host's ``train`` takes of the launcher's environment (pure): ``PATH``, ``LANG``, ``HOME``."""
    return {"PATH": environ.get("PATH", os.defpath), "LANG": environ.get("LANG", "C.UTF-8"),
            "HOME": environ.get("HOME", "/root")}


def run_local(job: LocalJob, workdir: Path, *, environ: Mapping[str, str], timeout_s: float = run_loop.DEFAULT_TIMEOUT_S,
              out: BinaryIO | None = None, stop_grace_s: float = run_loop.DEFAULT_STOP_GRACE_S,
              before_start: Callable[[NamespaceCluster], None] | None = None,
              on_start: Callable[[Mapping[str, EnteredProcess]], None] | None = None,
              restart: Restart | None = None) -> list[HostResult]:
    """Run ``job`` on local hosts under ``workdir``; every host's result, in host order.

    ``environ`` is the launcher's (its caller's) environment: every host's ``train`` takes its ``PATH``,
    ``LANG`` and ``HOME`` (``base_environment``), nothing else of it.  Nothing of the cluster survives the call.  SIGINT/SIGTERM to the caller, or the
    timeout, stops every host's ``train`` (which stops its part of the job within
    ``stop_grace_s``: ``run_loop``), then the cluster is torn down.

    ``restart`` makes each host a container (a test's model of a kubelet): when a host's
    ``train`` ends, what it left in the host ends with it, as a container's processes do
    (listed as survivors if ``train`` exited on its own), and ``restart`` says whether and
    when it starts again in the same host (name, address, ``/opt/ml``); ``on_start`` hears
    of each restarted ``train`` too.
    """
    out = out if out is not None else sys.stdout.buffer
    starting = list(job.start_hosts) if job.start_hosts is not None else list(job.hosts)
    lock = threading.Lock()
    width = max(len(h) for h in job.hosts)
    with NamespaceCluster([*job.hosts, *job.outsiders], workdir) as cluster, \
            run_loop.stopped_by_signals(threading.Event()) as stop:
        for name in job.hosts:
            host_tree(cluster.host(name).opt_ml, job, name)
        if before_start is not None:
            before_start(cluster)
        holders = {name: set(pids) for name, pids in cluster.pids().items()}
        base_env = {**base_environment(environ), **run_loop.grace_environment(stop_grace_s), **job.env}
        if job.platform_secret:
            base_env[JOB_SECRET] = secrets.token_hex(32)
        pumps = []

        def start(name: str) -> EnteredProcess:
            env = {**base_env, **job.host_env.get(name, {})}
            proc = cluster.popen(name, list(job.train or default_train()), env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            prefix = host_prefix(name, width)
            pumps.extend(Pump(read_chunks(stream), LinePrefixer(out, prefix, lock)) for stream in (proc.stdout, proc.stderr))
            return proc

        def restarted(name: str) -> None:
            watched.procs[name] = start(name)
            if on_start is not None:
                on_start({name: watched.procs[name]})

        watched = _Trains() if restart is None else _Trains(restart, restarted, lambda name: _end_remains(
            cluster, name, holders.get(name, set())))
        try:
            for name in starting:
                watched.procs[name] = start(name)
            if on_start is not None:
                on_start(watched.procs)
            run_loop.run(watched, len(watched.procs), stop, timeout_s=timeout_s, stop_grace_s=stop_grace_s)
        finally:
            ended = dict(watched.ended())
            codes = {name: proc.poll() for name, proc in watched.procs.items()}
            survivors = _survivors(cluster, holders) if len(ended) == len(watched.procs) else {}
            for name, left in watched.remains.items():
                survivors[name] = [*left, *survivors.get(name, [])]
    for pump in pumps:
        pump.thread.join(timeout=2)
    results = []
    for host in job.hosts:
        results.append(read_result(host, layout.host_opt_ml(workdir, host), codes.get(host) if host in ended else None,
                                   ended.get(host), survivors.get(host, ())))
    return results


# (host, its train's exit code) -> seconds until it starts again in the same host, or None: it stays ended
Restart = Callable[[str, int], "float | None"]


class _Trains:
    """The hosts' ``train`` processes, as the run loop watches and stops them (and restarts them, as containers)."""

    def __init__(self, restart: Restart | None = None, start: Callable[[str], None] | None = None,
                 end_remains: Callable[[str], list[str]] | None = None) -> None:
        self.procs: dict[str, EnteredProcess] = {}
        self.remains: dict[str, list[str]] = {}  # what a train that exited on its own left in its host
        self._ended: dict[str, float] = {}
        self._due: dict[str, float] = {}  # host -> when its train starts again
        self._restart, self._start, self._end_remains = restart, start, end_remains

    def ended(self) -> Mapping[str, float]:
        now = time.monotonic()
        for name, when in list(self._due.items()):
            if now >= when and self._start is not None:
                del self._due[name]
                self._start(name)
        for name, proc in self.procs.items():
            if name in self._ended or name in self._due or proc.poll() is None:
                continue
            if self._end_remains is not None:  # a container's processes end with its first
                left = self._end_remains(name)
                if left and proc.returncode >= 0:
                    self.remains.setdefault(name, []).extend(left)
            delay = self._restart(name, proc.returncode) if self._restart is not None else None
            if delay is None:
                self._ended[name] = now
            else:
                self._due[name] = now + delay
        return self._ended

    def stop(self, kill_after_s: float) -> None:
        self._restart = None  # stopped: nothing starts again
        for name in self._due:
            self._ended[name] = time.monotonic()
        self._due.clear()
        stop_processes([p for name, p in self.procs.items() if name not in self.ended()], kill_after_s)
        self.ended()


def _end_remains(cluster: NamespaceCluster, name: str, before: set[int]) -> list[str]:
    """SIGKILL what is left in a host whose train ended (as a container's end does); what was left.

    Each is held through a pidfd first and signalled only if the host still holds its pid after that
    (``supervise/pidfd.py``): a pid reused outside the host is never hit.
    """
    held = [(h, pid, line) for pid, line in _new_in_host(cluster.pids().get(name, []), before)
            if (h := pidfd.hold(pid)) is not None]
    inside = set(cluster.pids().get(name, []))  # looked again, after the pidfds were opened
    left = []
    for h, pid, line in held:
        if pid in inside and h.send(signal.SIGKILL):
            left.append(f"{pid} {line}")
        h.close()
    return left


def _survivors(cluster: NamespaceCluster, before: Mapping[str, set[int]]) -> dict[str, list[str]]:
    """Processes a host's train left behind: everything in its namespace that was not there before it."""
    time.sleep(0.05)  # let the kernel finish reaping what exited with train
    found = {}
    for name, pids in cluster.pids().items():
        left = [f"{pid} {line}" for pid, line in _new_in_host(pids, before.get(name, set()))]
        if left:
            found[name] = left
    return found


def _new_in_host(pids: Iterable[int], before: set[int]) -> list[tuple[int, str]]:
    """The host's processes that were not there before its train, with their command lines (the living ones)."""
    return [(pid, line) for pid in pids if pid not in before if (line := procfs.cmdline(pid)) is not None]
