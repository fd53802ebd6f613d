"""Parameter servers: TF_CONFIG for every host, ps servers owned by the toolkit, done when the chief is.

The first host runs the user's script as the chief (``master`` with legacy
naming), the others as workers; the toolkit itself runs a CPU-only
``tf.distribute.Server`` for each ps task.  When the chief's script ends, the
job ends: every worker script and ps server is stopped, on every host, at
once (a ps's ``join()`` never returns, which is why the reference can hang).
A ps or worker dying fails the job everywhere.
"""

from __future__ import annotations

import json

from training_toolkit import ps_server
from training_toolkit.agent import HostAgent, Local
from training_toolkit.cluster.guard import GuardSpec
from training_toolkit.plan import ParameterServerOptions
from training_toolkit.report import Outcome
from training_toolkit.runners.base import RunContext
from training_toolkit.runners.tf_config import PsLayout
from training_toolkit.runners.ports import check_free


def run(ctx: RunContext) -> Outcome:
    return ParameterServerAgent(ctx).run()


def layout_of(ctx: RunContext) -> PsLayout:
    options = ctx.plan.options
    assert isinstance(options, ParameterServerOptions), options
    return PsLayout(hosts=ctx.plan.hosts, naming=options.naming, num_ps=options.num_ps,
                    worker_port=options.worker_port, ps_port=options.ps_port)


def describe(ctx: RunContext) -> dict:
    layout = layout_of(ctx)
    return {"TF_CONFIG": layout.script_config(ctx.plan.current_host),
            "parameter server TF_CONFIG": layout.ps_config(ctx.plan.current_host)}


class ParameterServerAgent(HostAgent):
    def guard_spec(self) -> GuardSpec:
        """TensorFlow's gRPC servers (workers' and ps'): anyone who reaches one can run graphs on it."""
        layout = layout_of(self.ctx)
        return GuardSpec(ports=frozenset({layout.worker_port, layout.ps_port}))

    def prepare(self) -> None:
        layout = layout_of(self.ctx)
        check_free(layout.worker_port, "TensorFlow worker", self.host)
        if layout.ps_config(self.host) is not None:
            check_free(layout.ps_port, "parameter server", self.host)

    def start(self) -> list[Local]:
        layout = layout_of(self.ctx)
        started = []
        ps = layout.ps_config(self.host)
        if ps is not None:
            env = {**self.ctx.script_env, "TF_CONFIG": json.dumps(ps), "CUDA_VISIBLE_DEVICES": ""}
            server = self.supervise([self.ctx.python, ps_server.__file__], env, cwd=str(self.ctx.code_dir))
            started.append(Local("parameter server", server, primary=False, program=False))
        env = {**self.ctx.script_env, "TF_CONFIG": json.dumps(layout.script_config(self.host))}
        # The chief's end is the job's end (wait_for_peers is off); a worker's script may serve
        # until stopped (TF2) or finish its own loop (estimator era): both are fine.
        started.append(Local("script", self.supervise(self.ctx.argv, env, cwd=str(self.ctx.code_dir))))
        return started
