"""Run one job in containers, one per host, through the ``docker`` SDK (``training-toolkit local --image``).

The engine is whatever ``DOCKER_HOST`` (or the default socket) names: dockerd or
podman's Docker-compatible service.  Each host is a container on a network of
its own, built from the pure specs of ``containers.py``; its ``/opt/ml`` is a
directory of this machine, laid out by ``job.host_tree`` as for the namespace
launcher, so results are read the same way.

On every end (the job's, an error, SIGINT/SIGTERM to the caller, the timeout) the
containers still running get SIGTERM and the grace period (``train`` inside
passes it on to every rank), then every container and the network labelled with
the job are removed.  When the launcher itself dies (SIGKILL), its dead-man switch
(``supervise/deadman.py``) runs the reaper (``reaper.py``), which removes them; should
the switch be killed too, the next launcher on this machine does, before it starts its own job.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from training_toolkit.supervise import procfs
from training_toolkit.local import artifacts, engine, reaper, run_loop
from training_toolkit.local.containers import ContainerJob, container_job, new_job_id
from training_toolkit.local.layout import host_opt_ml
from training_toolkit.local.job import INTERFACE, HostResult, LocalJob, host_tree, read_result
from training_toolkit.local.prefix import LinePrefixer, Pump, host_prefix
from training_toolkit.core.log import log
from training_toolkit.supervise.deadman import Deadman


@dataclass(frozen=True)
class ContainerRun:
    """What a container job left: each host's result, the job's id (its label), and the artifacts."""

    job_id: str
    results: list[HostResult]
    model_tar: Path | None
    output_tar: Path | None
    starting_at: float | None  # time.monotonic() just before the first container was started
    started_at: float | None  # time.monotonic() once every container was started
    leftovers: tuple[str, ...]  # what the engine still held of the job after teardown (should be nothing)


def run_containers(job: LocalJob, workdir: Path, *, image: str, source: Path, environ: Mapping[str, str],
                   timeout_s: float = run_loop.DEFAULT_TIMEOUT_S, out: BinaryIO | None = None,
                   stop_grace_s: float = run_loop.DEFAULT_STOP_GRACE_S, gpus: bool = False,
                   client: Any = None, job_id: str | None = None, interface: str | None = INTERFACE,
                   abort_on_exit: bool = False, on_start: Callable[[Mapping[str, Any]], None] | None = None) -> ContainerRun:
    """Run ``job`` in one container of ``image`` per host; nothing labelled with the job survives the call.

    ``interface`` None writes resourceconfig.json without an interface name, and ``abort_on_exit``
    stops every container once one has exited, as SageMaker's local mode (docker-compose
    ``--abort-on-container-exit``) does: the image must work under both.

    ``environ`` is the launcher's (its caller's) environment: ``DOCKER_HOST`` names the engine, and the
    reaper (``reaper.py``) is started with it should the launcher die.

    Raises ``engine.EngineError`` (one line) when the job cannot start: no engine, no image, a
    name taken, a container that will not start; nothing is left then either.
    """
    out = out if out is not None else sys.stdout.buffer
    url = engine.socket_url(environ)
    client = client or engine.connect(url, pool_size=4 * len(job.hosts) + 8)
    remove_abandoned(client)
    engine.check_image(client, image, url)
    taken = engine.taken_names(client, job.hosts)
    if taken:
        raise engine.EngineError(f"containers named {', '.join(taken)} already exist: remove them "
                                 f"(`docker rm -f {' '.join(taken)}`) or choose other host names (--host-suffix)")
    job_id = job_id or new_job_id()
    workdir.mkdir(parents=True, exist_ok=True)
    for host in job.hosts:
        host_tree(host_opt_ml(workdir, host), job, host, copy_channels=False, interface=interface)
    spec = container_job(job, image=image, workdir=workdir.resolve(), source=source.resolve(), job_id=job_id,
                         secret=secrets.token_hex(32) if job.platform_secret else None,
                         grace_s=stop_grace_s, gpus=gpus, launcher=procfs.identity())
    # Removes the job should this launcher die (the switch has a session of its own: what kills the
    # caller's process group, a CI job's timeout, does not reach it)
    reaping = Deadman(then=reaper.command(job_id), env=environ)
    streams = engine.connect(url, pool_size=2 * len(job.hosts) + 4, timeout_s=None)
    watch = _Watch(client, streams, spec, out)
    started_at = None
    with run_loop.stopped_by_signals(threading.Event()) as stop:
        try:
            watch.create_and_start(stop)
            started_at = time.monotonic()
            if on_start is not None:
                on_start(watch.containers)
            if not stop.is_set():
                run_loop.run(watch, len(job.hosts), stop, timeout_s=timeout_s, stop_grace_s=stop_grace_s,
                             abort_on_exit=abort_on_exit)
        finally:
            watch.join_pumps(2.0 if watch.all_ended.is_set() else 0.2)  # the last lines, before the logs go
            problems = engine.remove_job(client, job_id)
            reaping.disarm()  # the job is removed: let the switch go
    watch.join_pumps(1.0)
    streams.close()
    if problems:
        log(f"local: removing job {job_id}: {'; '.join(problems)}")
    left = tuple(engine.leftovers(client, job_id))
    ended = watch.ended()
    results = [read_result(host, host_opt_ml(workdir, host), watch.codes.get(host), ended.get(host))
               for host in job.hosts]
    model_tar, output_tar = artifacts.collect([r.opt_ml for r in results], workdir)
    return ContainerRun(job_id, results, model_tar, output_tar, watch.starting_at, started_at, left)


def remove_abandoned(client: Any) -> None:
    """Remove every job whose launcher on this machine died without removing it (and whose reaper died too)."""
    for job_id, launcher in engine.abandoned_jobs(client, procfs.identity_alive).items():
        problems = engine.remove_job(client, job_id)
        pid = launcher.split(":")[-2]  # procfs.identity: BOOT:PIDNS:PID:START
        log(f"local: removed job {job_id}, left by a launcher that died (pid {pid})"
            + (f"; could not remove: {'; '.join(problems)}" if problems else ""))


def _all_at_once(calls: list[Callable[[], Any]], specs: list) -> list:
    """Run the engine calls in parallel; the first failure (in host order) becomes the one-line error."""
    import docker.errors

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
    results = []
    for future, spec in zip(futures, specs):
        exc = future.exception()
        if isinstance(exc, docker.errors.APIError):
            raise engine.start_error(spec.name, spec.image, exc) from None
        if exc is not None:
            raise exc
        results.append(future.result())
    return results


class _Watch:
    """The job's containers: started, their output pumped, their exits waited for, stopped on demand."""

    def __init__(self, client: Any, streams: Any, spec: ContainerJob, out: BinaryIO):
        self._client, self._streams, self._spec, self._out = client, streams, spec, out
        self.containers: dict[str, Any] = {}
        self.codes: dict[str, int] = {}
        self._ended: dict[str, float] = {}
        self.all_ended = threading.Event()
        self.starting_at: float | None = None
        self._lock = threading.Lock()
        self._pumps: list[Pump] = []

    def create_and_start(self, stop: threading.Event) -> None:
        """The network, then every container created, then every container started: each step for all hosts at once."""
        self._client.networks.create(**self._spec.network_kwargs())
        specs = list(self._spec.containers)
        created = _all_at_once([lambda c=c: self._client.containers.create(**c.create_kwargs()) for c in specs], specs)
        self.containers = {c.name: container for c, container in zip(specs, created)}
        if stop.is_set():
            return
        width = max(len(c.name) for c in specs)
        output_lock = threading.Lock()
        self.starting_at = time.monotonic()
        _all_at_once([container.start for container in created], specs)
        for name, container in self.containers.items():
            # The exit is asked for once the container's log has ended (the engine ends a followed log when
            # the container exits), not waited for from the start: podman 4.3's service spends a whole core
            # on each pending wait until the container exits (measured: 3.6-4.0 s of CPU for a 3.5 s
            # container, 10-20 ms for following its log), which its 2x2 MPI jobs paid in their ranks' time.
            self._pumps.append(Pump(self._logs(container.id),
                                    LinePrefixer(self._out, host_prefix(name, width), output_lock),
                                    on_end=lambda name=name, container=container: self._wait(name, container)))

    def _logs(self, container_id: str):
        """The container's output from its start, as it comes (asked for in the pump's thread: it may block)."""
        yield from self._streams.api.logs(container_id, stream=True, follow=True, stdout=True, stderr=True)

    def _wait(self, name: str, container: Any) -> None:
        try:
            code = int(container.wait()["StatusCode"])
        except Exception:  # removed under us (teardown): the exit is unknown
            return
        with self._lock:
            self.codes[name] = code
            self._ended[name] = time.monotonic()
            if len(self._ended) == len(self._spec.containers):
                self.all_ended.set()

    def ended(self) -> dict[str, float]:
        with self._lock:
            return dict(self._ended)

    def stop(self, kill_after_s: float) -> None:
        """SIGTERM to every container still running, at once; the engine kills what outlives ``kill_after_s``."""
        threads = [threading.Thread(target=self._stop, args=(c, kill_after_s), daemon=True)
                   for c in self.containers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for pump in self._pumps:
            pump.thread.join(timeout=5)

    def _stop(self, container: Any, kill_after_s: float) -> None:
        try:
            container.stop(timeout=int(kill_after_s + 0.999))
        except Exception as exc:
            log(f"local: stopping {container.name}: {engine.cause(exc)}")

    def join_pumps(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for pump in self._pumps:
            pump.thread.join(timeout=max(0.0, deadline - time.monotonic()))
