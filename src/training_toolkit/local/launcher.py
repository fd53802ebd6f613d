"""Run one job on N local hosts: a namespace per host, ``train`` in each, output prefixed by host.

This is both a product feature (try a multi-host job before paying for a
cluster) and the test bed of every multi-host claim.  Each host gets its own
``/opt/ml`` (resourceconfig naming it ``current_host``), its own hostname and
address, and the job's per-job secret in its environment; the launcher
collects every host's exit code and verdict, and tears everything down, even
when the job fails or the launcher is interrupted.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from training_toolkit import procfs
from training_toolkit.local.netns import NamespaceCluster
from training_toolkit.settings import JOB_SECRET
from training_toolkit.stopping import stop_processes

INTERFACE = "eth0"


@dataclass(frozen=True)
class LocalJob:
    """A job to run on local hosts.  ``hyperparameters`` are the raw strings of hyperparameters.json."""

    hosts: Sequence[str]
    hyperparameters: Mapping[str, str]
    channels: Mapping[str, Path] = field(default_factory=dict)  # channel -> directory copied to every host
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for every host's train
    host_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # per host, on top of env
    instance_groups: Sequence[Mapping] = ()
    start_hosts: Sequence[str] | None = None  # hosts whose train starts (default: all)
    train: Sequence[str] = ()  # the command each host runs (default: our train)
    platform_secret: bool = True  # give every host a fresh job secret, as a platform may (SageMaker does not)
    outsiders: Sequence[str] = ()  # namespaces on the job's network that are not hosts of the job (for tests)


@dataclass(frozen=True)
class HostResult:
    host: str
    exit_code: int | None  # None: still running at the timeout, or never started
    success: bool
    failure: str | None
    opt_ml: Path
    ended_at: float | None  # time.monotonic() when its train ended
    survivors: tuple[str, ...] = ()  # processes still in the host once its train ended (should be none)

    @property
    def model_dir(self) -> Path:
        return self.opt_ml / "model"


def host_tree(opt_ml: Path, job: LocalJob, host: str) -> None:
    """Lay out one host's /opt/ml (config, data) as a platform would."""
    config = opt_ml / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    resource = {"current_host": host, "hosts": list(job.hosts), "network_interface_name": INTERFACE}
    if job.instance_groups:
        resource["instance_groups"] = [dict(g) for g in job.instance_groups]
        group = next(g for g in job.instance_groups if host in g["hosts"])
        resource["current_group_name"] = group["instance_group_name"]
        resource["current_instance_type"] = group["instance_type"]
    (config / "hyperparameters.json").write_text(json.dumps(dict(job.hyperparameters)))
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    data_config = {name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                          "RecordWrapperType": "None"} for name in job.channels}
    (config / "inputdataconfig.json").write_text(json.dumps(data_config))
    for name, source in job.channels.items():
        shutil.copytree(source, opt_ml / "input" / "data" / name, dirs_exist_ok=True)
    for sub in ("model", "output/data", "code"):
        (opt_ml / sub).mkdir(parents=True, exist_ok=True)


class _Prefixer:
    """Copies a host's stream to ours line by line, each line prefixed; partial lines wait for their end."""

    def __init__(self, source: BinaryIO, sink: BinaryIO, prefix: bytes, lock: threading.Lock):
        self._source, self._sink, self._prefix, self._lock = source, sink, prefix, lock
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        pending = b""
        while True:
            chunk = os.read(self._source.fileno(), 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                self._emit(b"".join(self._prefix + line + b"\n" for line in lines))
        if pending:
            self._emit(self._prefix + pending + b"\n")
        self._source.close()

    def _emit(self, data: bytes) -> None:
        with self._lock:
            try:
                self._sink.write(data)
                self._sink.flush()
            except (OSError, ValueError):
                pass


def default_train() -> list[str]:
    return [str(Path(sys.executable).with_name("train"))]


def run_local(job: LocalJob, workdir: Path, *, timeout_s: float = 600, out: BinaryIO | None = None,
              stop_grace_s: float = 10.0, before_start: Callable[[NamespaceCluster], None] | None = None,
              on_start: Callable[[Mapping[str, subprocess.Popen]], None] | None = None) -> list[HostResult]:
    """Run ``job`` on local hosts under ``workdir``; every host's result, in host order.

    Nothing of the cluster survives the call.  SIGINT/SIGTERM to the caller is
    passed to every host's ``train`` (which stops its part of the job), then the
    cluster is torn down.
    """
    out = out if out is not None else sys.stdout.buffer
    starting = list(job.start_hosts) if job.start_hosts is not None else list(job.hosts)
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen] = {}
    ended: dict[str, float] = {}
    stop = threading.Event()
    width = max(len(h) for h in job.hosts)
    previous = {}

    def on_signal(signum, _frame):
        stop.set()

    with NamespaceCluster([*job.hosts, *job.outsiders], workdir) as cluster:
        for name in job.hosts:
            host_tree(cluster.host(name).opt_ml, job, name)
        if before_start is not None:
            before_start(cluster)
        holders = {name: set(pids) for name, pids in cluster.pids().items()}
        base_env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"),
                    "HOME": os.environ.get("HOME", "/root"), **job.env}
        if job.platform_secret:
            base_env[JOB_SECRET] = secrets.token_hex(32)
        pumps = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, on_signal)
        try:
            for name in starting:
                env = {**base_env, **job.host_env.get(name, {})}
                proc = cluster.popen(name, list(job.train or default_train()), env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
                procs[name] = proc
                prefix = f"[{name.ljust(width)}] ".encode()
                pumps += [_Prefixer(proc.stdout, out, prefix, lock), _Prefixer(proc.stderr, out, prefix, lock)]
            if on_start is not None:
                on_start(procs)
            deadline = time.monotonic() + timeout_s
            while len(ended) < len(procs) and time.monotonic() < deadline and not stop.is_set():
                for name, proc in procs.items():
                    if name not in ended and proc.poll() is not None:
                        ended[name] = time.monotonic()
                time.sleep(0.01)
            if stop.is_set():
                stop_processes(list(procs.values()), stop_grace_s)
                for name, proc in procs.items():
                    if name not in ended and proc.poll() is not None:
                        ended[name] = time.monotonic()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            codes = {name: proc.poll() for name, proc in procs.items()}
            survivors = _survivors(cluster, holders) if len(ended) == len(procs) else {}
    for pump in pumps:
        pump.thread.join(timeout=2)
    results = []
    for host in job.hosts:
        opt_ml = workdir / host / "opt" / "ml"  # NamespaceCluster keeps each host's tree there
        failure_file = opt_ml / "output" / "failure"
        results.append(HostResult(
            host=host,
            exit_code=codes.get(host) if host in ended else None,
            success=(opt_ml / "output" / "success").exists(),
            failure=failure_file.read_text(errors="replace") if failure_file.exists() else None,
            opt_ml=opt_ml,
            ended_at=ended.get(host),
            survivors=tuple(survivors.get(host, ())),
        ))
    return results


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
