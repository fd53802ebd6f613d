"""The stall watch: a component the agent owns (``HostAgent.stall``) and calls, with everything it needs given.

Progress is watched in every job of more than one seat, for the job's record (each attempt's first
progress, the script's checkpoint marks): its processes get the heartbeat directory, where a file
touched is progress and ``checkpoint`` touched marks a checkpoint saved (``process_env``), and their
output marks progress (``on_output``); they also get the directory where a rank that is not this host's
child is reported by its parent, and the flags its parent reads (``supervise/reported.py``: MPI's), which the
agent's stop makes (``agent/parts.py``).  While stalls are watched (a stall timeout, in any job), the
processes also get the faulthandler hook and the stack files' directory, and this host reads its
ranks' stacks when the lead asks (``gather`` on the lead, ``send`` elsewhere; docs/resilience.md).
A job of one seat without a stall timeout gets none of it: its launch stays the reference's.
Everything here loads the stack readers only when stalls are watched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING

from training_toolkit.agent.events import StacksGathered
from training_toolkit.config.settings import HEARTBEAT_DIR_VAR, RESTART_COUNT_VAR

if TYPE_CHECKING:
    from training_toolkit.agent.progress import ProgressWatch
    from training_toolkit.supervise.deadman import Deadman
    from training_toolkit.stalls import stacks
    from training_toolkit.cluster.seat import Seat
    from training_toolkit.runspec import Local
    from training_toolkit.stalls.stackreport import RankStack

STACKS_REQUEST_S = 4.0  # the lead: how long the followers may take to send their ranks' stacks


class StallWatch:
    """``timeout_s`` None: stalls are not watched (no hook, no stacks); ``progress``: progress is watched all the same
    (every job of more than one seat).  Neither: nothing is started, the processes get only the attempt.

    ``events``: the agent's queue (progress and the gathered stacks go there); ``py_spy``: the setting
    (``stacks.pyspy_path``); ``environ``: the toolkit's environment, which says where runtime
    directories go (``rundir``).
    """

    def __init__(self, events: SimpleQueue, timeout_s: float | None, py_spy: str | None = None,
                 environ: Mapping[str, str] | None = None, progress: bool = False):
        self._events = events
        self._environ = environ or {}
        self._timeout_s = timeout_s
        self._py_spy = py_spy
        self._progress_wanted = progress or timeout_s is not None
        self.watch_dir: Path | None = None  # this host's heartbeat and stack files, once started
        self._progress: ProgressWatch | None = None
        self._tripwire: Deadman | None = None

    def start(self, job_id: str, host: str) -> Path | None:
        """Progress (and stalls, with a timeout) is watched from now on (the job's id and this host name the
        directory the host's files go to); the directory is removed even if train is killed (a dead-man switch).
        Returns the directory (None: nothing is watched)."""
        if not self._progress_wanted:
            return None
        from training_toolkit.agent.progress import ProgressWatch, watch_dir
        from training_toolkit.supervise import rundir
        from training_toolkit.supervise.deadman import Deadman

        self.watch_dir = watch_dir(job_id or None, rundir.parent(self._environ), host)
        self._tripwire = Deadman(directories=[self.watch_dir])  # gone even if train is killed
        self._progress = ProgressWatch(self._events, self.watch_dir / "heartbeats")
        return self.watch_dir

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()
        if self.watch_dir is not None:
            import shutil

            shutil.rmtree(self.watch_dir, ignore_errors=True)
        if self._tripwire is not None:
            self._tripwire.disarm()

    def attempt_started(self, attempt: int) -> None:
        """Progress counts for ``attempt`` from now on (an earlier attempt's heartbeats are stale)."""
        if self._progress is not None:
            self._progress.attempt = attempt

    def process_env(self, env: Mapping[str, str], attempt: int) -> dict[str, str]:
        """``env`` with what every process of the job gets: the attempt; while progress is watched, the heartbeat
        directory and where a rank's parent reports the rank and reads its host's flags (``supervise/reported.py``);
        and the hook and the stack files' directory while stalls are."""
        extra = {RESTART_COUNT_VAR: str(attempt)}
        if self.watch_dir is not None:
            from training_toolkit.supervise import reported

            extra[HEARTBEAT_DIR_VAR] = str(self.watch_dir / "heartbeats")
            extra.update(reported.parent_environment(self.watch_dir))
        if self.watch_dir is not None and self._timeout_s is not None:
            from training_toolkit.stalls import stacks

            extra.update(stacks.script_env(self.watch_dir, dict(env)))
        return {**env, **extra}

    def on_output(self, attempt: int) -> Callable[[], None] | None:
        """What a process's output line calls while watched: progress of ``attempt`` (None: not watched)."""
        if self._progress is None:
            return None
        seen = self._progress.output_seen
        return lambda: seen(attempt)

    def watched(self, locals_: Sequence[Local]) -> list[stacks.Watched]:
        """This host's processes whose stacks a stall report shows: those that run the user's program, its own
        children (``Local.program``: not mpirun, not a parameter server) and the ranks their parents reported."""
        from training_toolkit.stalls import stacks
        from training_toolkit.supervise import reported

        own = [stacks.Watched(local.child.pid, local.rank, local.name) for local in locals_
               if local.program and local.child.poll() is None]
        if self.watch_dir is None:
            return own
        return own + [stacks.Watched(r.pid, r.rank, f"rank {r.rank}" if r.rank is not None else f"process {r.pid}")
                      for r in reported.reported(self.watch_dir / reported.DIR_NAME)]

    def gather(self, seat: Seat, host: str, hosts: Sequence[str], locals_: Sequence[Local]) -> None:
        """The lead: its ranks' stacks and every other host's (``StacksGathered`` on the queue)."""
        from training_toolkit.stalls import stacks
        from training_toolkit.stalls.stackreport import RankStack

        found: list[RankStack] = []
        local = threading.Thread(target=lambda: found.extend(self._local(host, locals_)), name="local-stacks",
                                 daemon=True)
        local.start()
        answers = seat.request_stacks(STACKS_REQUEST_S)
        local.join(stacks.READ_TIMEOUT_S + 2.0)
        for other in hosts[1:]:
            sent = answers.get(other)
            if isinstance(sent, list):
                found.extend(s for s in (RankStack.from_wire(item, other) for item in sent[:1024]) if s is not None)
        missing = tuple(h for h in hosts[1:] if not isinstance(answers.get(h), list))
        self._events.put(StacksGathered(tuple(found), missing))

    def send(self, seat: Seat, host: str, locals_: Sequence[Local]) -> None:
        """Other hosts: this host's ranks' stacks, to the lead."""
        seat.send_stacks([s.to_wire() for s in self._local(host, locals_)])

    def _local(self, host: str, locals_: Sequence[Local]) -> list[RankStack]:
        from training_toolkit.stalls import stacks

        stacks_dir = self.watch_dir / "stacks" if self.watch_dir is not None else None
        return stacks.gather(host, self.watched(locals_), stacks_dir, stacks.pyspy_path(self._py_spy))
