"""MultiWorkerMirroredStrategy: one worker per host, TF_CONFIG of workers only, index by host order.

Every host runs the script; the job succeeds when every host's script has
succeeded, and fails everywhere as soon as one fails.
"""

from __future__ import annotations

import json

from training_toolkit.agent import HostAgent, Local
from training_toolkit.cluster.guard import GuardSpec
from training_toolkit.plan import MultiWorkerMirroredOptions
from training_toolkit.report import Outcome
from training_toolkit.runners.base import RunContext
from training_toolkit.runners.tf_config import mwms_config
from training_toolkit.runners.ports import check_free


def run(ctx: RunContext) -> Outcome:
    return MultiWorkerMirroredAgent(ctx).run()


def port_of(ctx: RunContext) -> int:
    options = ctx.plan.options
    assert isinstance(options, MultiWorkerMirroredOptions), options
    return options.port


def describe(ctx: RunContext) -> dict:
    return {"TF_CONFIG": mwms_config(ctx.plan.hosts, ctx.plan.current_host, port_of(ctx))}


class MultiWorkerMirroredAgent(HostAgent):
    wait_for_peers = True

    def guard_spec(self) -> GuardSpec:
        """Each worker's TensorFlow gRPC server: anyone who reaches it can run graphs on it."""
        return GuardSpec(ports=frozenset({port_of(self.ctx)}))

    def prepare(self) -> None:
        check_free(port_of(self.ctx), "TensorFlow worker", self.host)

    def start(self) -> list[Local]:
        config = mwms_config(self.ctx.plan.hosts, self.host, port_of(self.ctx))
        env = {**self.ctx.script_env, "TF_CONFIG": json.dumps(config)}
        return [Local("script", self.supervise(self.ctx.argv, env, cwd=str(self.ctx.code_dir)))]
