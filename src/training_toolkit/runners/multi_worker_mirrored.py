"""MultiWorkerMirroredStrategy: one worker per host, TF_CONFIG of workers only, index by host order.

Every host runs the script; the job succeeds when every host's script has
succeeded, and fails everywhere as soon as one fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from training_toolkit.cluster.guard import GuardSpec
from training_toolkit.job.plan import MultiWorkerMirroredOptions
from training_toolkit.runners.ports import check_free
from training_toolkit.runners.tf_config import mwms_config
from training_toolkit.runspec import Proc, RunContext, RunnerSpec, Seating


def port_of(ctx: RunContext) -> int:
    options = ctx.plan.options
    assert isinstance(options, MultiWorkerMirroredOptions), options
    return options.port


def describe(ctx: RunContext) -> dict:
    return {"TF_CONFIG": mwms_config(ctx.plan.hosts, ctx.plan.current_host, port_of(ctx))}


def spec(ctx: RunContext) -> RunnerSpec:
    # each worker's TensorFlow gRPC server: anyone who reaches it can run graphs on it
    return RunnerSpec(processes, wait_for_peers=True, guard=GuardSpec(ports=frozenset({port_of(ctx)})), prepare=prepare)


@contextmanager
def prepare(seat: Seating) -> Iterator[None]:
    """Before barrier 0: the ports this host listens on are free (nothing is held)."""
    check_free(port_of(seat.ctx), "TensorFlow worker", seat.host)
    yield


def processes(seat: Seating) -> list[Proc]:
    ctx = seat.ctx
    env = {**ctx.script_env, "TF_CONFIG": json.dumps(mwms_config(ctx.plan.hosts, seat.host, port_of(ctx)))}
    return [Proc("script", ctx.argv, env, str(ctx.code_dir))]
