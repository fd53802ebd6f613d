"""Parameter servers: TF_CONFIG for every host, ps servers owned by the toolkit, done when the chief is.

The lead runs the user's script as the chief (``master`` with legacy
naming), the others as workers; the toolkit itself runs a CPU-only
``tf.distribute.Server`` for each ps task.  When the chief's script ends, the
job ends: every worker script and ps server is stopped, on every host, at
once (a ps's ``join()`` never returns, which is why the reference can hang).
A ps or worker dying fails the attempt everywhere.

Each attempt's ``TF_CONFIG`` comes from its active hosts (``processes`` sees the attempt's
``Seating.ctx``): with spares or a minimum (``TRAINING_TOOLKIT_MAX_HOSTS``/``MIN_HOSTS``) a spare
runs neither script nor ps server, a spare seated in a lost host's place takes its worker and ps
indexes, and a job that shrinks renumbers the workers after the lost one (docs/contract.md).  A
lost ps host is a lost host like any other: every ps server starts empty at the restart and the
chief restores the variables from its checkpoint (docs/resilience.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from training_toolkit.runners import ps_server
from training_toolkit.cluster.guard import GuardSpec
from training_toolkit.job.plan import ParameterServerOptions
from training_toolkit.runners.ports import check_free
from training_toolkit.runners.tf_config import PsLayout
from training_toolkit.runspec import Proc, RunContext, RunnerSpec, Seating


def layout_of(ctx: RunContext) -> PsLayout:
    options = ctx.plan.options
    assert isinstance(options, ParameterServerOptions), options
    return PsLayout(hosts=ctx.plan.hosts, naming=options.naming, num_ps=options.num_ps,
                    worker_port=options.worker_port, ps_port=options.ps_port)


def describe(ctx: RunContext) -> dict:
    layout = layout_of(ctx)
    return {"TF_CONFIG": layout.script_config(ctx.plan.current_host),
            "parameter server TF_CONFIG": layout.ps_config(ctx.plan.current_host)}


def spec(ctx: RunContext) -> RunnerSpec:
    # TensorFlow's gRPC servers (workers' and ps'): anyone who reaches one can run graphs on it
    layout = layout_of(ctx)
    return RunnerSpec(processes, guard=GuardSpec(ports=frozenset({layout.worker_port, layout.ps_port})),
                      prepare=prepare)


@contextmanager
def prepare(seat: Seating) -> Iterator[None]:
    """Before barrier 0: the ports this host listens on are free (nothing is held)."""
    layout = layout_of(seat.ctx)
    check_free(layout.worker_port, "TensorFlow worker", seat.host)
    if layout.ps_config(seat.host) is not None:
        check_free(layout.ps_port, "parameter server", seat.host)
    yield


def processes(seat: Seating) -> list[Proc]:
    ctx, layout = seat.ctx, layout_of(seat.ctx)
    started = []
    ps = layout.ps_config(seat.host)
    if ps is not None:
        env = {**ctx.script_env, "TF_CONFIG": json.dumps(ps), "CUDA_VISIBLE_DEVICES": ""}
        started.append(Proc("parameter server", (ctx.python, ps_server.__file__), env, str(ctx.code_dir),
                            primary=False, program=False))
    env = {**ctx.script_env, "TF_CONFIG": json.dumps(layout.script_config(seat.host))}
    # The chief's end is the job's end (wait_for_peers is off); a worker's script may serve
    # until stopped (TF2) or finish its own loop (estimator era): both are fine.
    started.append(Proc("script", ctx.argv, env, str(ctx.code_dir)))
    return started
