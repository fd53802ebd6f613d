"""The job's processes on this host that ``train`` did not start: ranks that their parent reported to it.

An MPI rank runs under mpirun, under a worker's ``orted``/``prted`` (sshd's session), or under Slurm's step
daemon: never as a child of its host's ``train``.  Its parent, ``training-toolkit-rank``
(native/rank_exec.c), reports it in the directory ``RANKS_DIR_VAR`` names (its host's train gives that
directory in the rank file): one file per rank, named by the rank's pid, holding ``RANK START``, the job-wide
rank (-1: none named) and the start time that, with the pid, names one process for good.  The report is
removed once the rank has ended; a report whose process is gone, or whose pid now names another process (its
parent killed before it could remove it), is not a rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from training_toolkit.supervise import procfs

DIR_NAME = "ranks"  # the reports' directory, in the host's watch directory (agent/progress.py's ``watch_dir``)
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
        if report is not None and _running(report):
            found.append(report)
    return sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.pid))


def _running(report: Reported) -> bool:
    now = procfs.read(report.pid)
    return now is not None and not now.zombie and now.start == report.start
