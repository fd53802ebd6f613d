"""torch.distributed, as torchrun launches it: one process per device on every host, each told its place.

Every process gets what ``torch.distributed`` expects (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), as torchrun would give it; every one is supervised, and one
failing stops every host.  MPI-based libraries (Horovod, SageMaker's data parallel
library) go through the MPI runner instead.

Hosts may run different counts (a master with fewer GPUs than its workers, where the job names no count): as
torchrun's agents do through their store, each host tells its count when it joins (``introduction``), and a
host's ranks follow those of the hosts before it in the attempt's order (``rank_layout``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple

from training_toolkit.cluster import netaddr
from training_toolkit.cluster.guard import GuardSpec
from training_toolkit.core.errors import ClusterError
from training_toolkit.job.plan import TorchDistributedOptions
from training_toolkit.runners.ports import check_free
from training_toolkit.runspec import Proc, RunContext, RunnerSpec, Seating, introduced_count


PER_HOST_INTRO = "torch_processes_per_host"  # in each host's introduction: the processes it runs


class Layout(NamedTuple):
    """Where one host's processes sit in the job: its first rank, and every host's processes in all."""

    first_rank: int
    world_size: int
    local_world_size: int


def rank_layout(hosts: tuple[str, ...], host: str, counts: Mapping[str, int]) -> Layout:
    """``host``'s place, as torchrun's agents assign it: its ranks follow every process of the hosts before it in
    ``hosts``; ``counts``: each host's processes (pure)."""
    index = hosts.index(host)
    return Layout(sum(counts[h] for h in hosts[:index]), sum(counts[h] for h in hosts), counts[host])


def process_env(hosts: tuple[str, ...], host: str, layout: Layout, local_rank: int, master_port: int) -> dict[str, str]:
    """The torch.distributed variables of one process (pure)."""
    index = hosts.index(host)
    return {
        "RANK": str(layout.first_rank + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(layout.world_size),
        "LOCAL_WORLD_SIZE": str(layout.local_world_size),
        "GROUP_RANK": str(index),
        "NODE_RANK": str(index),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(master_port),
    }


def host_counts(hosts: tuple[str, ...], host: str, own: int,
                introductions: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    """Each host's processes: ``own`` for ``host``, every other one's as it introduced it (pure); a ClusterError
    names a host that told none, or no count."""
    counts = {host: own}
    for other in hosts:
        if other == host:
            continue
        said = introductions.get(other, {}).get(PER_HOST_INTRO, "")
        count = introduced_count(said)
        if count is None:
            raise ClusterError(f"{other} told no count of torch.distributed processes ({said!r}): every host of the "
                               "job must run this toolkit's torch_distributed runner")
        counts[other] = count
    return counts


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
    """The processes as ``plan`` shows them, before any host joined: as if every host ran this host's count."""
    options = torch_options(ctx)
    per_host = options.processes_per_host
    layout = rank_layout(ctx.plan.hosts, ctx.plan.current_host, dict.fromkeys(ctx.plan.hosts, per_host))
    return {"processes": [process_env(ctx.plan.hosts, ctx.plan.current_host, layout, i, options.master_port)
                          for i in range(per_host)]}


def spec(ctx: RunContext) -> RunnerSpec:
    # torch's TCPStore on the lead: anyone who reaches it can read and write the rendezvous
    options = torch_options(ctx)
    return RunnerSpec(processes, wait_for_peers=True, guard=GuardSpec(ports=frozenset({options.master_port})),
                      introduction=lambda: {PER_HOST_INTRO: str(options.processes_per_host)}, prepare=prepare)


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
    layout = rank_layout(ctx.plan.hosts, seat.host, host_counts(ctx.plan.hosts, seat.host, per_host, seat.introductions or {}))
    interface = ctx.job.resource.network_interface_name
    bind = interface_env(ctx.script_env, interface, netaddr.interface_ipv4(interface) is not None)
    started = []
    for local_rank in range(per_host):
        extra = process_env(ctx.plan.hosts, seat.host, layout, local_rank, options.master_port)
        extra["TORCHELASTIC_RESTART_COUNT"] = str(seat.attempt.number)  # as torchrun gives it
        rank = int(extra["RANK"])
        started.append(Proc(f"rank {rank}", ctx.argv, {**ctx.script_env, **bind, **extra}, str(ctx.code_dir), rank))
    return started
