"""Runners: one module each, sharing the supervision and cluster mechanics outside them.

A runner module gives ``spec(ctx) -> runspec.RunnerSpec`` (what it is on this
host: the agent runs it) and ``describe(ctx) -> dict`` (for ``training-toolkit
plan``); it imports nothing of the agent.  ``runner(name)`` is the one way to
find one: a table from every name in ``names.RUNNERS`` to its module, imported
when asked for, so ``train`` loads only the one it runs.  A new runner is a
module and a line here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from training_toolkit.core import names

if TYPE_CHECKING:
    from training_toolkit.runspec import RunContext, RunnerSpec


class Runner(Protocol):
    """What a runner module gives: its ``spec`` on this host, and ``describe`` for ``training-toolkit plan``."""

    def spec(self, ctx: RunContext) -> RunnerSpec: ...

    def describe(self, ctx: RunContext) -> dict[str, Any]: ...


RUNNERS: dict[str, str] = {  # runner name -> its module in this package
    names.SINGLE: "single",
    names.MPI: "mpi",
    names.PARAMETER_SERVER: "parameter_server",
    names.MULTI_WORKER_MIRRORED: "multi_worker_mirrored",
    names.TORCH_DISTRIBUTED: "torch_distributed",
}


def runner(name: str) -> Runner:
    """The runner called ``name`` (one of ``names.RUNNERS``)."""
    try:
        module = RUNNERS[name]
    except KeyError:
        raise ValueError(f"no runner called {name!r}") from None
    return __import__(f"{__name__}.{module}", fromlist=["spec"])  # the import statement's path (-X importtime sees it)
