"""Single: one process, the user's script, supervised until it ends."""

from __future__ import annotations

from training_toolkit.errors import CodeError
from training_toolkit.process import STOPPING_SIGNALS, SignalForwarder, Supervised
from training_toolkit.report import Outcome
from training_toolkit.runners.base import RunContext, outcome_of


def run(ctx: RunContext) -> Outcome:
    child: Supervised | None = None
    stop_requested: list[int] = []

    def on_signal(signum: int) -> None:
        if child is None:
            stop_requested.append(signum)
        elif signum in STOPPING_SIGNALS:
            child.stop(signum, ctx.grace_s)
        else:
            child.send(signum)

    with SignalForwarder(on_signal):
        if stop_requested:
            return Outcome(128 + stop_requested[0], "stopped by a signal before the script started")
        try:
            child = Supervised(ctx.argv, ctx.script_env, cwd=str(ctx.code_dir))
        except OSError as exc:
            raise CodeError(f"cannot run {ctx.argv[0]}: {exc.strerror or exc}") from None
        for signum in stop_requested:
            on_signal(signum)
        status = child.wait()
    child.finish()
    return outcome_of(child, status)


def describe(ctx: RunContext) -> dict:
    return {}
