"""torch.distributed, as torchrun launches it: one process per device on every host, each told its place.

Every process gets what ``torch.distributed`` expects (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), as torchrun would give it; every one is supervised, and one
failing stops every host.  MPI-based libraries (Horovod, SageMaker's data parallel
library) go through the MPI runner instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from training_toolkit.cluster import netaddr
from training_toolkit.cluster.guard import GuardSpec
from training_toolkit.job.plan import TorchDistributedOptions
from training_toolkit.runners.ports import check_free
from training_toolkit.runspec import Proc, RunContext, RunnerSpec, Seating


def process_env(hosts: tuple[str, ...], host: str, per_host: int, local_rank: int, master_port: int) -> dict[str, str]:
    """The torch.distributed variables of one process (pure)."""
    index = hosts.index(host)
    return {
        "RANK": str(index * per_host + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(len(hosts) * per_host),
        "LOCAL_WORLD_SIZE": str(per_host),
        "GROUP_RANK": str(index),
        "NODE_RANK": str(index),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(master_port),
    }


def interface_env(script_env: dict[str, str], interface: str | None, exists: bool) -> dict[str, str]:
    """Gloo and NCCL bind their listeners to this interface's address rather than the host name's (pure).

    Their ports are random and unauthenticated, so the guard cannot filter them
    (docs/security.md): on the job's interface at least they are not on every
    other network the host is on.  A value the script's environment sets wins.
    """
    if not interface or not exists:
        return {}
    return {name: interface for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if name not in script_env}


def torch_options(ctx: RunContext) -> TorchDistributedOptions:
    options = ctx.plan.options
    assert isinstance(options, TorchDistributedOptions), options
    return options


def describe(ctx: RunContext) -> dict:
    options = torch_options(ctx)
    return {"processes": [process_env(ctx.plan.hosts, ctx.plan.current_host, options.processes_per_host, i,
                                      options.master_port) for i in range(options.processes_per_host)]}


def spec(ctx: RunContext) -> RunnerSpec:
    # torch's TCPStore on the lead: anyone who reaches it can read and write the rendezvous
    return RunnerSpec(processes, wait_for_peers=True, guard=GuardSpec(ports=frozenset({torch_options(ctx).master_port})),
                      prepare=prepare)


@contextmanager
def prepare(seat: Seating) -> Iterator[None]:
    """Before barrier 0: the ports this host listens on are free (nothing is held)."""
    if seat.leads:
        check_free(torch_options(seat.ctx).master_port, "torch.distributed store", seat.host)
    yield


def processes(seat: Seating) -> list[Proc]:
    ctx = seat.ctx
    options = torch_options(ctx)
    per_host = options.processes_per_host
    interface = ctx.job.resource.network_interface_name
    bind = interface_env(ctx.script_env, interface, netaddr.interface_ipv4(interface) is not None)
    started = []
    for local_rank in range(per_host):
        extra = process_env(ctx.plan.hosts, seat.host, per_host, local_rank, options.master_port)
        extra["TORCHELASTIC_RESTART_COUNT"] = str(seat.attempt.number)  # as torchrun gives it
        rank = int(extra["RANK"])
        started.append(Proc(f"rank {rank}", ctx.argv, {**ctx.script_env, **bind, **extra}, str(ctx.code_dir), rank))
    return started
