"""The agent's part in watching for stalls: what the job's processes get, and the stacks of a stalled job.

A mixin of ``HostAgent`` (``agent.py``), kept apart so the template stays
readable: the progress watch and its directory, the environment every
process of the job gets (``supervise``, ``job_env``: a runner gets the latter in its
``Seating``), and reading this host's ranks' stacks when the first host asks
(``docs/resilience.md``).
Everything here loads the stack readers only when a job is watched.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING

from training_toolkit.agent_events import StacksGathered
from training_toolkit.process import Supervised
from training_toolkit.settings import RESTART_COUNT_VAR
from training_toolkit.watch import ProgressWatch

if TYPE_CHECKING:
    from training_toolkit import stacks
    from training_toolkit.cluster.membership import Seat
    from training_toolkit.runspec import Local, RunContext, RunnerSpec
    from training_toolkit.stackreport import RankStack

STACKS_REQUEST_S = 4.0  # first host: how long the other hosts may take to send their ranks' stacks


class StallWatch:
    """Needs of its host class: ``ctx``, ``spec``, ``host``, ``hosts``, ``membership``, ``events``, ``locals``, ``attempt``."""

    ctx: RunContext
    spec: RunnerSpec
    host: str
    hosts: tuple[str, ...]
    membership: Seat | None
    events: SimpleQueue
    locals: list[Local]
    attempt: int  # the host class's current attempt (HostAgent.attempt, from its state)
    watch_dir: Path | None = None  # this host's heartbeat and stack files, while stalls are watched
    _progress: ProgressWatch | None = None

    def supervise(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None, **kw) -> Supervised:
        """Start one process of the job: with the attempt, and the stall watch's hook and output relay if on."""
        extra = {RESTART_COUNT_VAR: str(self.attempt)}
        if self.watch_dir is not None:
            from training_toolkit import stacks

            extra.update(stacks.script_env(self.watch_dir, dict(env)))
        on_output = None
        if self._progress is not None:
            seen, attempt = self._progress.output_seen, self.attempt
            on_output = lambda: seen(attempt)  # noqa: E731 - this attempt's output only
        return Supervised(argv, {**env, **extra}, cwd=cwd, on_output=on_output, **kw)

    def job_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with what ``supervise`` adds, for a runner whose ranks are not its children (mpirun's: ``Seating``)."""
        extra = {RESTART_COUNT_VAR: str(self.attempt)}
        if self.watch_dir is not None:
            from training_toolkit import stacks

            extra.update(stacks.script_env(self.watch_dir, dict(env)))
        return {**env, **extra}

    def watched(self) -> list[stacks.Watched]:
        """This host's processes whose stacks a stall report shows (the runner's word, else every local process)."""
        if self.spec.watched is not None:
            return self.spec.watched(self.locals)
        from training_toolkit import stacks

        return [stacks.Watched(local.child.pid, local.rank, local.name) for local in self.locals
                if local.child.poll() is None]

    def _start_watch(self) -> None:
        if self.ctx.settings.stall_timeout_s is None:
            return
        from training_toolkit import stacks

        assert self.membership is not None
        self.watch_dir = stacks.watch_dir(self.membership.job_id or None)
        self._progress = ProgressWatch(self.events, self.watch_dir / "heartbeats")

    def _end_watch(self) -> None:
        if self._progress is not None:
            self._progress.close()
        if self.watch_dir is not None:
            import shutil

            shutil.rmtree(self.watch_dir, ignore_errors=True)

    def _gather_stacks(self) -> None:
        from training_toolkit import stacks
        from training_toolkit.stackreport import RankStack

        assert self.membership is not None
        found: list[RankStack] = []
        local = threading.Thread(target=lambda: found.extend(self._local_stacks()), name="local-stacks", daemon=True)
        local.start()
        answers = self.membership.request_stacks(STACKS_REQUEST_S)
        local.join(stacks.READ_TIMEOUT_S + 2.0)
        for host in self.hosts[1:]:
            sent = answers.get(host)
            if isinstance(sent, list):
                found.extend(s for s in (RankStack.from_wire(item, host) for item in sent[:1024]) if s is not None)
        missing = tuple(h for h in self.hosts[1:] if not isinstance(answers.get(h), list))
        self.events.put(StacksGathered(tuple(found), missing))

    def _send_stacks(self) -> None:
        assert self.membership is not None
        self.membership.send_stacks([s.to_wire() for s in self._local_stacks()])

    def _local_stacks(self) -> list[RankStack]:
        from training_toolkit import stacks

        stacks_dir = self.watch_dir / "stacks" if self.watch_dir is not None else None
        return stacks.gather(self.host, self.watched(), stacks_dir, stacks.pyspy_path(self.ctx.settings.py_spy))
