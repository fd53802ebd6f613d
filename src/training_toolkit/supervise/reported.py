"""The job's processes on this host that ``train`` did not start: ranks that their parent reported to it, and
the two flags by which their parents learn how their host stops them.

An MPI rank runs under mpirun, under a worker's ``orted``/``prted`` (sshd's session), or under Slurm's step
daemon: never as a child of its host's ``train``.  Its parent, ``training-toolkit-rank``
(native/rank_exec.c), reports it in the directory ``RANKS_DIR_VAR`` names (its host's train gives that
directory in the rank file): one file per rank, named by the rank's pid, holding ``RANK START``, the job-wide
rank (-1: none named) and the start time that, with the pid, names one process for good.  The report is
removed once the rank has ended; a report whose process is gone, or whose pid now names another process (its
parent killed before it could remove it), is not a rank.

The flags sit beside the reports' directory, in the host's watch directory; each host's ``train`` makes them, the
ranks' parents only read them.  While ``stopping`` exists, this host stops its ranks: each rank's parent holds
the rank's end from Open MPI's runtime, which would otherwise end every other rank (and their saves) at the
first one that ends, and the rank's stop library makes an ``MPI_Abort`` end that rank alone (native/rank_stop.c).
``restarting`` says the stop is a restart's: nothing is held, the runtime sees every end and ends by itself.
Every process of the job gets the paths (``parent_environment``); only MPI's ranks have a parent that reads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from training_toolkit.config.settings import RANK_RESTART_FLAG_VAR, RANK_STOP_FLAG_VAR, RANKS_DIR_VAR
from training_toolkit.supervise import procfs

DIR_NAME = "ranks"  # the reports' directory, in the host's watch directory (agent/progress.py's ``watch_dir``)
STOP_FLAG = "stopping"  # in the watch directory: this host stops its ranks (their ends are held)
RESTART_FLAG = "restarting"  # in the watch directory: it stops them for a restart (nothing is held)
MAX_REPORTS = 4096  # a host runs at most this many ranks; more files in the directory are not read


class Reported(NamedTuple):
    """A rank of this host as its parent reported it."""

    pid: int
    rank: int | None  # its job-wide rank (None: the runtime named none)
    start: int  # its start time (``procfs.Proc.start``)


def parse(name: str, text: str) -> Reported | None:
    """One report: ``name`` the file's (the pid), ``text`` its content; None for anything else (a part-written
    file, a stranger's).  Pure."""
    words = text.split()
    if not name.isdigit() or len(words) != 2 or not text.endswith("\n"):
        return None
    rank, start = words
    if not start.isdigit() or not (rank.isdigit() or rank == "-1"):
        return None
    return Reported(int(name), None if rank == "-1" else int(rank), int(start))


def reported(directory: Path) -> list[Reported]:
    """The ranks reported in ``directory`` that are running now, in rank order (none if it is missing)."""
    found = [report for report in _reports(directory) if _running(procfs.read(report.pid), report)]
    return sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.pid))


def targets(directory: Path) -> list[procfs.Proc]:
    """What a stop of this host signals besides its own children: each reported rank running now, and what it
    started (a data loader's workers), parents first; each as one look saw it, so a pid reused since is left alone."""
    table = procfs.snapshot()
    found: list[procfs.Proc] = []
    for report in _reports(directory):
        rank = table.get(report.pid)
        if _running(rank, report):
            found.append(rank)
            found.extend(proc for proc in procfs.descendants(rank.pid, table) if not proc.zombie)
    return found


def _reports(directory: Path) -> list[Reported]:
    """Every well-formed report in ``directory``, running or not (none if it is missing)."""
    try:
        names = sorted(os.listdir(directory))[:MAX_REPORTS]
    except OSError:
        return []
    found = []
    for name in names:
        try:
            report = parse(name, (directory / name).read_text())
        except (OSError, UnicodeDecodeError):
            continue  # removed since the listing: its rank ended
        if report is not None:
            found.append(report)
    return found


def _running(now: procfs.Proc | None, report: Reported) -> bool:
    """``now`` (a look at the report's pid) is the reported rank, still running."""
    return now is not None and not now.zombie and now.start == report.start


def parent_environment(watch_dir: Path) -> dict[str, str]:
    """Where a rank's parent reports the rank, and the paths of its host's flags (native/rank_exec.c, rank_stop.c)."""
    return {RANKS_DIR_VAR: str(watch_dir / DIR_NAME), RANK_STOP_FLAG_VAR: str(watch_dir / STOP_FLAG),
            RANK_RESTART_FLAG_VAR: str(watch_dir / RESTART_FLAG)}


def raise_flag(watch_dir: Path, name: str) -> None:
    """Make the flag ``name`` (``STOP_FLAG``, ``RESTART_FLAG``): from now on the ranks' parents see it."""
    (watch_dir / name).touch(mode=0o600, exist_ok=True)


def lower_flags(watch_dir: Path) -> None:
    """Before a restart's barrier: a stop of the last attempt holds no end of the next one."""
    for name in (STOP_FLAG, RESTART_FLAG):
        (watch_dir / name).unlink(missing_ok=True)
