"""Kubeflow PyTorchJob: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` and ``PET_*``.

The training-operator gives every pod ``MASTER_ADDR=<job>-master-0``, ``MASTER_PORT``,
``WORLD_SIZE`` (pods) and ``RANK`` (the master 0, worker ``i`` rank ``i+1``)
(``pkg/controller.v1/pytorch/envvar.go``, ``setPodEnv``), and, for torchrun, ``PET_NNODES``,
``PET_NODE_RANK``, ``PET_NPROC_PER_NODE`` and ``PET_MASTER_*``.  The pods' names follow
``<job>-<type>-<index>`` (``genGeneralName``), each behind its own headless service, so the
hosts are ``<job>-master-0, <job>-worker-0, ...``.  More than one host, or more than one
process per pod, means torch.distributed (the toolkit's torchrun-style runner).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from training_toolkit import names
from training_toolkit.errors import ConfigError
from training_toolkit.platforms.view import PYTORCHJOB, PodView, integer

_MASTER_SUFFIX = "-master-0"


def view(environ: Mapping[str, str]) -> PodView:
    source = "PyTorchJob environment"
    master = environ.get("MASTER_ADDR", "")
    if not master.endswith(_MASTER_SUFFIX) or len(master) == len(_MASTER_SUFFIX):
        raise ConfigError(source, "MASTER_ADDR", f"expected <job>{_MASTER_SUFFIX}, got {master!r}")
    if ":" in environ.get("PET_NNODES", ""):
        raise ConfigError(source, "PET_NNODES", f"an elastic range ({environ['PET_NNODES']}) is not supported: "
                          "the toolkit runs a fixed set of hosts")
    nnodes = integer(environ, "PET_NNODES" if environ.get("PET_NNODES") else "WORLD_SIZE", source, minimum=1)
    node_rank = integer(environ, "PET_NODE_RANK" if environ.get("PET_NODE_RANK") else "RANK", source)
    if node_rank >= nnodes:
        raise ConfigError(source, "RANK", f"rank {node_rank} of {nnodes} pods")
    port = integer(environ, "MASTER_PORT", source, minimum=1)
    job = master[: -len(_MASTER_SUFFIX)]
    hosts = (master, *(f"{job}-worker-{i}" for i in range(nnodes - 1)))
    per_host = environ.get("PET_NPROC_PER_NODE", "")
    params: dict = {}
    if per_host.isdigit() and int(per_host) > 0:
        params[names.TORCH_PROCESSES_PER_HOST] = int(per_host)
    if nnodes > 1 or params.get(names.TORCH_PROCESSES_PER_HOST, 1) > 1:
        params[names.distribution("torch_distributed").switch] = True
        params["sagemaker_distributed_master_port"] = port
    return PodView(PYTORCHJOB, hosts, hosts[node_rank], MappingProxyType(params))
