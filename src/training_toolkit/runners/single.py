"""Single: one process, the user's script, run by the agent as a job of one seat.

No channel and no port (``SoloSeat``): the agent gives the single runner what
it gives every runner (signals forwarded with the grace period, a stall watch,
restarts), through the same phases, so there is one runner shell.  A job of
several hosts without a distribution runs the script on each host on its own,
as the reference does: each host is then its own job of one seat.
"""

from __future__ import annotations

from training_toolkit.agent import HostAgent, Local
from training_toolkit.cluster.membership import SoloSeat
from training_toolkit.errors import CodeError, ToolkitError
from training_toolkit.process import ExitStatus
from training_toolkit.report import Outcome
from training_toolkit.runners.base import RunContext, outcome_of


def run(ctx: RunContext) -> Outcome:
    return SingleAgent(ctx).run()


def describe(ctx: RunContext) -> dict:
    return {}


class SingleAgent(HostAgent):
    own_end_on_stop = True  # as the reference: a script that saved and exited 0 on SIGTERM succeeded

    def __init__(self, ctx: RunContext):
        super().__init__(ctx, SoloSeat, hosts=(ctx.plan.current_host,))

    def start(self) -> list[Local]:
        try:
            child = self.supervise(self.ctx.argv, self.ctx.script_env, cwd=str(self.ctx.code_dir))
        except OSError as exc:
            raise CodeError(f"cannot run {self.ctx.argv[0]}: {exc.strerror or exc}") from None
        return [Local("script", child)]

    def setup_failure(self, exc: ToolkitError) -> str:
        return str(exc)  # one host: the reason names no host, as before

    def failure_of(self, local: Local, status: ExitStatus) -> Outcome:
        return outcome_of(local.child, status)  # one host: the reason names no host, as before
