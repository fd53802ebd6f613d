"""Single: one process, the user's script, run by the agent as a job of one seat.

No channel and no port (``solo``: an ``agent.seats.SoloSeat``): the agent gives the single
runner what it gives every runner (signals forwarded with the grace period, a
stall watch, restarts), through the same phases, so there is one runner shell.
A job of several hosts without a distribution runs the script on each host on
its own, as the reference does: each host is then its own job of one seat.
"""

from __future__ import annotations

from training_toolkit.runspec import Proc, RunContext, RunnerSpec, Seating


def spec(ctx: RunContext) -> RunnerSpec:
    # as the reference's: a script that saved and exited 0 on SIGTERM succeeded (``RunnerSpec.solo``)
    return RunnerSpec(processes, solo=True)


def processes(seat: Seating) -> list[Proc]:
    return [Proc("script", seat.ctx.argv, seat.ctx.script_env, str(seat.ctx.code_dir))]


def describe(ctx: RunContext) -> dict:
    return {}
