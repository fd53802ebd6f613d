"""Kubeflow PyTorchJob: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` and ``PET_*``.

The training-operator gives every container of every pod ``MASTER_ADDR=<job>-master-0``,
``MASTER_PORT``, ``RANK`` (the master 0, worker ``i`` rank ``i+1``: a node rank),
``WORLD_SIZE`` (pods x nprocPerNode, so not the pod count), and for torchrun ``PET_NNODES``
(the pods), ``PET_NODE_RANK``, ``PET_NPROC_PER_NODE`` and ``PET_MASTER_*``
(``pkg/controller.v1/pytorch/envvar.go``).  ``nprocPerNode`` defaults to ``"auto"``; like
torchrun, ``auto`` is this pod's GPUs, else its CPUs, and ``gpu``/``cpu`` name one of them.
The pods are ``<job>-master-0, <job>-worker-0, ...``, each behind its own headless service.
More than one pod, or more than one process per pod, means torch.distributed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from training_toolkit.core import names
from training_toolkit.core.errors import ConfigError
from training_toolkit.core.hardware import Hardware
from training_toolkit.platforms.kubernetes import PodPlatform, in_a_pod
from training_toolkit.platforms.view import Facts, integer

_MASTER_SUFFIX = "-master-0"
SOURCE = "PyTorchJob environment"


class PyTorchJob(PodPlatform):
    name = "pytorchjob"

    def detected(self, facts: Facts) -> bool:
        env = facts.environ
        return in_a_pod(facts) and bool(env.get("PET_NNODES") or (env.get("MASTER_ADDR") and env.get("RANK")))

    def hosts_of(self, facts: Facts):
        hosts, current, params = cluster_of(facts.environ, facts.hardware)
        return hosts, current, params, 0


def processes_per_pod(raw: str, hardware: Hardware) -> int:
    """``PET_NPROC_PER_NODE`` as torchrun reads it: a number, ``gpu``, ``cpu``, or ``auto`` (GPUs, else CPUs)."""
    if raw.isascii() and raw.isdigit() and int(raw) > 0:
        return int(raw)
    if raw == "gpu" and hardware.num_gpus:
        return hardware.num_gpus
    if raw == "cpu":
        return hardware.num_cpus
    if raw == "auto":
        return hardware.num_gpus or hardware.num_cpus
    problem = "this pod has no GPU" if raw == "gpu" else f"expected a number, auto, gpu or cpu, got {raw!r}"
    raise ConfigError(SOURCE, "PET_NPROC_PER_NODE", problem)


def cluster_of(environ: Mapping[str, str], hardware: Hardware):
    """(hosts, this host, default hyperparameters) from the operator's variables."""
    master = environ.get("MASTER_ADDR", "")
    if not master.endswith(_MASTER_SUFFIX) or len(master) == len(_MASTER_SUFFIX):
        raise ConfigError(SOURCE, "MASTER_ADDR", f"expected <job>{_MASTER_SUFFIX}, got {master!r} "
                          "(an elastic PyTorchJob without a Master replica is not supported)")
    if ":" in environ.get("PET_NNODES", ""):
        raise ConfigError(SOURCE, "PET_NNODES", f"an elastic range ({environ['PET_NNODES']}) is not supported: "
                          "the toolkit runs a fixed set of hosts")
    if not environ.get("PET_NNODES"):
        raise ConfigError(SOURCE, "PET_NNODES", "missing: the training-operator (v1.7 and later) sets it on every "
                          "container; WORLD_SIZE counts processes, not pods, and cannot stand in for it")
    nnodes = integer(environ, "PET_NNODES", SOURCE, minimum=1)
    node_rank = integer(environ, "PET_NODE_RANK" if environ.get("PET_NODE_RANK") else "RANK", SOURCE)
    if node_rank >= nnodes:
        raise ConfigError(SOURCE, "PET_NODE_RANK", f"pod rank {node_rank} of {nnodes} pods")
    port = integer(environ, "MASTER_PORT", SOURCE, minimum=1)
    job = master[: -len(_MASTER_SUFFIX)]
    hosts = (master, *(f"{job}-worker-{i}" for i in range(nnodes - 1)))
    per_pod = processes_per_pod(environ.get("PET_NPROC_PER_NODE") or "auto", hardware)
    params: dict = {names.TORCH_PROCESSES_PER_HOST: per_pod}
    if nnodes > 1 or per_pod > 1:
        params[names.distribution("torch_distributed").switch] = True
        params[names.TORCH_MASTER_PORT_KEY] = port
    return hosts, hosts[node_rank], MappingProxyType(params)
