"""What the container launcher asks the engine for: one container per host, as plain data (pure).

Nothing here talks to an engine: these builders turn a job into the
specification of its network and containers, and those into the keyword
arguments of the ``docker`` SDK's ``containers.create``, so that each choice is
tested against exact values.  ``engine.py`` talks to the engine and
``container_launcher.py`` runs the job.

What each container gets, as a platform gives it:
- its own ``/opt/ml`` (a bind mount of ``WORKDIR/HOST/opt/ml``, laid out by ``job.host_tree``);
- a name and hostname that are the host's name: the engine's DNS on the job's network resolves
  container names (podman's resolves names, not ``--hostname``), so every host finds the others;
- each channel's local directory at ``/opt/ml/input/data/NAME``, read-only;
- the code at ``CODE_DIR``, read-only, named by ``sagemaker_submit_directory``;
- a fresh job secret (``TRAINING_TOOLKIT_JOB_SECRET``) and the job's grace period;
- the machine's GPUs, as a device request for every GPU, when asked for.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from training_toolkit.local import run_loop
from training_toolkit.local.job import LocalJob
from training_toolkit.local.layout import host_opt_ml
from training_toolkit.config.settings import JOB_SECRET

#: Labels on everything made for a job: what the launcher removes, and what tests look for.
LABEL_JOB = "io.training-toolkit.job"
LABEL_HOST = "io.training-toolkit.host"
#: Which process launched the job (``procfs.identity``): the next launcher removes a job whose launcher
#: died without removing it (SIGKILL, and its reaper killed too).
LABEL_LAUNCHER = "io.training-toolkit.launcher"

#: Where the job's code is mounted (read-only) in every container.
CODE_DIR = "/opt/code"
OPT_ML = "/opt/ml"

#: The command each container runs: ``train`` from the image's PATH, as SageMaker starts an image.
TRAIN = ("train",)

#: /dev/shm of each container: MPI's and NCCL's shared-memory transports between a host's ranks
#: outgrow the engines' default of 64 MB.
SHM_SIZE = "1g"


def new_job_id() -> str:
    """A fresh id: the job's network name and the value of its label."""
    return "tt-" + secrets.token_hex(4)


def host_names(count: int, suffix: str | None = None) -> tuple[str, ...]:
    """``algo-1`` .. ``algo-N``, or ``algo-1-SUFFIX`` .. (SageMaker's local mode adds a random suffix)."""
    tail = f"-{suffix}" if suffix else ""
    return tuple(f"algo-{i}{tail}" for i in range(1, count + 1))


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False

    def to_api(self) -> dict:
        """The Engine API's form (what ``docker.types.Mount`` holds)."""
        return {"Type": "bind", "Source": str(self.source), "Target": self.target, "ReadOnly": self.read_only}


@dataclass(frozen=True)
class ContainerSpec:
    """One host's container."""

    name: str
    image: str
    network: str
    labels: Mapping[str, str]
    environment: Mapping[str, str]
    mounts: Sequence[Mount]
    gpus: bool = False
    entrypoint: Sequence[str] = TRAIN
    shm_size: str = SHM_SIZE

    def create_kwargs(self) -> dict:
        """Keyword arguments of ``DockerClient.containers.create`` for this container (pure)."""
        kwargs = {
            "image": self.image,
            "name": self.name,
            "hostname": self.name,
            "entrypoint": list(self.entrypoint),
            "command": [],
            "environment": dict(self.environment),
            "labels": dict(self.labels),
            "mounts": [m.to_api() for m in self.mounts],
            "network": self.network,
            "shm_size": self.shm_size,
            "stop_signal": "SIGTERM",
            "detach": True,
        }
        if self.gpus:
            kwargs["device_requests"] = [{"count": -1, "capabilities": [["gpu"]]}]
        return kwargs


@dataclass(frozen=True)
class ContainerJob:
    """A whole job's worth of engine objects: its network and one container per host."""

    job_id: str
    network: str
    labels: Mapping[str, str]
    containers: Sequence[ContainerSpec] = field(default_factory=tuple)

    def network_kwargs(self) -> dict:
        """Keyword arguments of ``DockerClient.networks.create`` (pure)."""
        return {"name": self.network, "driver": "bridge", "labels": dict(self.labels), "check_duplicate": True}


def container_job(job: LocalJob, *, image: str, workdir: Path, source: Path, job_id: str,
                  secret: str | None, grace_s: float, gpus: bool = False, launcher: str | None = None) -> ContainerJob:
    """The network and containers for ``job`` (pure): ``secret`` None gives the hosts none (admission by address).

    ``launcher``: the launching process's ``procfs.identity``, put on every label set.
    """
    labels = {LABEL_JOB: job_id, **({LABEL_LAUNCHER: launcher} if launcher else {})}
    containers = []
    for host in job.hosts:
        environment = {**run_loop.grace_environment(grace_s), **job.env, **job.host_env.get(host, {})}
        if secret is not None:
            environment[JOB_SECRET] = secret
        mounts = [Mount(host_opt_ml(workdir, host), OPT_ML), Mount(source, CODE_DIR, read_only=True)]
        mounts += [Mount(directory, f"{OPT_ML}/input/data/{name}", read_only=True)
                   for name, directory in job.channels.items()]
        containers.append(ContainerSpec(
            name=host, image=image, network=job_id, labels={**labels, LABEL_HOST: host},
            environment=environment, mounts=tuple(mounts), gpus=gpus,
            entrypoint=tuple(job.train) or TRAIN,
        ))
    return ContainerJob(job_id=job_id, network=job_id, labels=labels, containers=tuple(containers))
