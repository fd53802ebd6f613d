"""Runners: one module each, sharing the supervision and cluster mechanics outside them.

``runner(name)`` is the one way to find a runner: a table from every name in
``names.RUNNERS`` to its module, each of which has the ``Runner`` interface.
Modules are imported when asked for, so ``train`` loads only the one it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from training_toolkit import names

if TYPE_CHECKING:
    from training_toolkit.report import Outcome
    from training_toolkit.runners.base import RunContext


class Runner(Protocol):
    """What a runner module gives: ``run`` the job on this host, ``describe`` it for ``training-toolkit plan``."""

    def run(self, ctx: RunContext) -> Outcome: ...

    def describe(self, ctx: RunContext) -> dict[str, Any]: ...


def _single() -> Runner:
    from training_toolkit.runners import single

    return single


def _mpi() -> Runner:
    from training_toolkit.runners import mpi

    return mpi


def _parameter_server() -> Runner:
    from training_toolkit.runners import parameter_server

    return parameter_server


def _multi_worker_mirrored() -> Runner:
    from training_toolkit.runners import multi_worker_mirrored

    return multi_worker_mirrored


def _torch_distributed() -> Runner:
    from training_toolkit.runners import torch_distributed

    return torch_distributed


RUNNERS: dict[str, Callable[[], Runner]] = {
    names.SINGLE: _single,
    names.MPI: _mpi,
    names.PARAMETER_SERVER: _parameter_server,
    names.MULTI_WORKER_MIRRORED: _multi_worker_mirrored,
    names.TORCH_DISTRIBUTED: _torch_distributed,
}


def runner(name: str) -> Runner:
    """The runner called ``name`` (one of ``names.RUNNERS``)."""
    try:
        load = RUNNERS[name]
    except KeyError:
        raise ValueError(f"no runner called {name!r}") from None
    return load()
