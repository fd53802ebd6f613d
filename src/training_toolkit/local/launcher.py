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
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from training_toolkit import procfs
from training_toolkit.local.job import INTERFACE, HostResult, LocalJob, host_tree, read_result
from training_toolkit.local import run_loop
from training_toolkit.local.netns import EnteredProcess, NamespaceCluster
from training_toolkit.local.prefix import LinePrefixer, Pump, host_prefix, read_chunks
from training_toolkit.settings import JOB_SECRET
from training_toolkit.stopping import stop_processes

__all__ = ["INTERFACE", "HostResult", "LocalJob", "default_train", "host_tree", "run_local"]


def default_train() -> list[str]:
    return [str(Path(sys.executable).with_name("train"))]


def run_local(job: LocalJob, workdir: Path, *, timeout_s: float = run_loop.DEFAULT_TIMEOUT_S,
              out: BinaryIO | None = None, stop_grace_s: float = run_loop.DEFAULT_STOP_GRACE_S,
              before_start: Callable[[NamespaceCluster], None] | None = None,
              on_start: Callable[[Mapping[str, EnteredProcess]], None] | None = None) -> list[HostResult]:
    """Run ``job`` on local hosts under ``workdir``; every host's result, in host order.

    Nothing of the cluster survives the call.  SIGINT/SIGTERM to the caller, or the
    timeout, stops every host's ``train`` (which stops its part of the job within
    ``stop_grace_s``: ``run_loop``), then the cluster is torn down.
    """
    out = out if out is not None else sys.stdout.buffer
    starting = list(job.start_hosts) if job.start_hosts is not None else list(job.hosts)
    lock = threading.Lock()
    width = max(len(h) for h in job.hosts)
    watched = _Trains()
    with NamespaceCluster([*job.hosts, *job.outsiders], workdir) as cluster, \
            run_loop.stopped_by_signals(threading.Event()) as stop:
        for name in job.hosts:
            host_tree(cluster.host(name).opt_ml, job, name)
        if before_start is not None:
            before_start(cluster)
        holders = {name: set(pids) for name, pids in cluster.pids().items()}
        base_env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"),
                    "HOME": os.environ.get("HOME", "/root"), **run_loop.grace_environment(stop_grace_s), **job.env}
        if job.platform_secret:
            base_env[JOB_SECRET] = secrets.token_hex(32)
        pumps = []
        try:
            for name in starting:
                env = {**base_env, **job.host_env.get(name, {})}
                proc = cluster.popen(name, list(job.train or default_train()), env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
                watched.procs[name] = proc
                prefix = host_prefix(name, width)
                pumps += [Pump(read_chunks(stream), LinePrefixer(out, prefix, lock)) for stream in (proc.stdout, proc.stderr)]
            if on_start is not None:
                on_start(watched.procs)
            run_loop.run(watched, len(watched.procs), stop, timeout_s=timeout_s, stop_grace_s=stop_grace_s)
        finally:
            ended = dict(watched.ended())
            codes = {name: proc.poll() for name, proc in watched.procs.items()}
            survivors = _survivors(cluster, holders) if len(ended) == len(watched.procs) else {}
    for pump in pumps:
        pump.thread.join(timeout=2)
    results = []
    for host in job.hosts:
        # NamespaceCluster keeps each host's tree under workdir/HOST/opt/ml
        results.append(read_result(host, workdir / host / "opt" / "ml", codes.get(host) if host in ended else None,
                                   ended.get(host), survivors.get(host, ())))
    return results


class _Trains:
    """The hosts' ``train`` processes, as the run loop watches and stops them."""

    def __init__(self) -> None:
        self.procs: dict[str, EnteredProcess] = {}
        self._ended: dict[str, float] = {}

    def ended(self) -> Mapping[str, float]:
        for name, proc in self.procs.items():
            if name not in self._ended and proc.poll() is not None:
                self._ended[name] = time.monotonic()
        return self._ended

    def stop(self, kill_after_s: float) -> None:
        stop_processes([p for name, p in self.procs.items() if name not in self.ended()], kill_after_s)
        self.ended()


def _survivors(cluster: NamespaceCluster, before: Mapping[str, set[int]]) -> dict[str, list[str]]:
    """Processes a host's train left behind: everything in its namespace that was not there before it."""
    time.sleep(0.05)  # let the kernel finish reaping what exited with train
    found = {}
    for name, pids in cluster.pids().items():
        left = [f"{pid} {line}" for pid in pids if pid not in before.get(name, set())
                if (line := procfs.cmdline(pid)) is not None]
        if left:
            found[name] = left
    return found
