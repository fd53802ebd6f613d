"""One stop, one run of the script's handler, where a process gets the same SIGTERM more than once.

Slurm's scancel and ``--time`` signal every process of the job themselves, and each host's ``train`` passes the
stop on to its processes as well: a process of the user's script then gets SIGTERM twice, milliseconds apart, and
Python runs its handler again, inside the first run (the save begun anew) or after it (saved twice).  The stop
rank's stop library (native/rank_stop.c), preloaded into the process, makes every SIGTERM within ``STOP_HEARD_S`` of its
first one stop: the script's handler runs once; a later SIGTERM is the script's again.  The library acts in the
process it is first loaded into (it names itself in ``TRAINING_TOOLKIT_RANK_PID``), not in what that process
starts.  MPI ranks get it from their rank file everywhere (runners/mpi_launch.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from training_toolkit.core.records import replace
from typing import TYPE_CHECKING

from training_toolkit import native
from training_toolkit.config.settings import RANK_STOP_WAIT_VAR
from training_toolkit.supervise.stopping import STOP_HEARD_S

if TYPE_CHECKING:
    from training_toolkit.runspec import Proc, RunnerSpec, Seating


def rank_stop_library() -> str:
    """The library that makes SIGTERMs that come together one stop, and a rank's stop its own (native/rank_stop.c)."""
    return str(native.path_of(native.RANK_STOP_LIBRARY))


def stop_window() -> dict[str, str]:
    """A process's SIGTERMs within this many milliseconds of its first are one stop (and an MPI rank's end after a
    SIGTERM waits up to as long for its host's decision: native/rank_exec.c)."""
    return {RANK_STOP_WAIT_VAR: str(round(STOP_HEARD_S * 1000))}


def one_stop_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a process of the user's script that the platform signals itself (``settings.one_stop``)."""
    from training_toolkit.runners.netshim import PRELOAD, preload_list  # (socket's import: under Slurm only)

    return {**env, PRELOAD: preload_list(env.get(PRELOAD), [rank_stop_library()]), **stop_window()}


def with_one_stop(spec: RunnerSpec, on: bool) -> RunnerSpec:
    """``spec``, whose processes of the user's script (``Proc.program``) get ``one_stop_environment`` when ``on``."""
    if not on:
        return spec

    def processes(seat: Seating) -> list[Proc]:
        return [replace(proc, env=one_stop_environment(proc.env)) if proc.program else proc
                for proc in spec.processes(seat)]

    return replace(spec, processes=processes)
