"""Progress, as the agent sees it without the script's help: output lines, and heartbeat files.

``ProgressWatch`` turns both into ``Progress`` events at most once per
``interval_s`` each, so a chatty script costs the agent's queue nothing: the
relay threads only set a flag (``output_seen``), and one thread looks at the
flag and at the heartbeat directory's files (a rank touches
``$TRAINING_TOOLKIT_HEARTBEAT_DIR/<anything>``, from any language).  The file named ``checkpoint``
there is also the script's mark that it has saved a checkpoint (``CHECKPOINT_MARK``): its event says
so, and the record counts the work since the last mark as lost at a fault (record/cost.py).

Each event carries the attempt it belongs to: the last words of an attempt
being stopped (mpirun's abort notice) must not count as the next attempt's
progress, or its startup allowance would be cut short.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from queue import SimpleQueue

from training_toolkit.agent.events import Progress
from training_toolkit.supervise import reported, rundir

INTERVAL_S = 0.5
CHECKPOINT_MARK = "checkpoint"  # in the heartbeat directory: a rank touches it once it has saved a checkpoint
DIR_PREFIX = "training-toolkit-watch-"


class ProgressWatch:
    def __init__(self, events: SimpleQueue, heartbeat_dir: Path, interval_s: float = INTERVAL_S):
        self._events = events
        self._heartbeat_dir = heartbeat_dir
        self._interval_s = interval_s
        self._output: int | None = None  # the attempt of the last output seen since the last event
        self._last_beat = 0
        self._last_mark = 0
        self.attempt = 0  # the attempt now running: the agent sets it when one starts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress-watch", daemon=True)
        self._thread.start()

    def output_seen(self, attempt: int) -> None:
        """Called by a relay thread for every chunk that holds an end of line: one store, no lock.

        ``attempt``: of the process that wrote it; the event carries it, and the step drops it if stale.
        """
        self._output = attempt

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            seen, self._output = self._output, None
            if seen is not None:
                self._events.put(Progress(False, seen))
            beat = latest_mtime(self._heartbeat_dir)
            if beat > self._last_beat:
                self._last_beat = beat
                mark = mtime(self._heartbeat_dir / CHECKPOINT_MARK)
                marked, self._last_mark = mark > self._last_mark, max(mark, self._last_mark)
                self._events.put(Progress(True, self.attempt, checkpoint=marked))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


def mtime(path: Path) -> int:
    """``path``'s modification time (ns); 0 when it is not there."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def latest_mtime(directory: Path) -> int:
    """The newest modification time (ns) of the files in ``directory``; 0 when there are none."""
    latest = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    latest = max(latest, entry.stat(follow_symlinks=False).st_mtime_ns)
                except OSError:
                    continue
    except OSError:
        return 0
    return latest


def watch_dir(job_id: str | None, parent: Path, host: str = "") -> Path:
    """This host's directory for the ranks' stack files and heartbeats: new, private (0700), of a random name.

    Each host's processes learn it from their own host (their environment, or the MPI ranks'
    file), so its name need not be the same on every host, and must not be: hosts may share
    the parent (``rundir``: nodes sharing ``/tmp``), where one name would be both hosts' directory.
    The name says the job (``job_id``'s hex) and the host, so that what a host killed whole leaves
    in a shared ``/tmp`` (nothing of it is left to remove it) is known for its: ``-HOST-`` before
    the random part.
    """
    tag = "".join(ch for ch in (job_id or "")[:16] if ch in "0123456789abcdef")  # a name's part: hex only
    name = "".join(ch for ch in host[:64] if ch.isascii() and (ch.isalnum() or ch in "._-")).lstrip(".")
    prefix = DIR_PREFIX + "".join(f"{part}-" for part in (tag, name) if part)
    path = rundir.new_private_dir(prefix, parent)
    for sub in ("stacks", "heartbeats", reported.DIR_NAME):  # the last: ranks that are not train's children
        (path / sub).mkdir(mode=0o700, exist_ok=True)
    return path
