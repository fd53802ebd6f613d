"""This host's part of an attempt: its local processes, their watchers, passing signals on, and their stop.

Each thing that blocks (a process's end, a runner's own stop, a stop for a
restart) runs in a thread of its own and ends as an event on the agent's
queue (``LocalExit``, ``PartStopped``, ``PartEnded``): the loop never waits on it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from queue import SimpleQueue

from training_toolkit.agent.events import LocalExit, PartEnded, PartStopped
from training_toolkit.core.log import log
from training_toolkit.supervise.process import FORWARDED_SIGNALS, STOPPING_SIGNALS, end_descendants
from training_toolkit.runspec import Local, RunnerSpec


class Part:
    """``locals``: the processes of the current attempt on this host (none on a spare)."""

    def __init__(self, events: SimpleQueue, spec: RunnerSpec, grace_s: float):
        self._events = events
        self._spec = spec
        self._grace_s = grace_s
        self.locals: list[Local] = []
        self._stopping = False  # a runner's own stop (``spec.stop``) has begun

    def watch(self, attempt: int) -> None:
        """Each local process's end becomes a ``LocalExit`` of ``attempt``."""
        for local in self.locals:
            _watch(local, self._events, attempt)

    def signal(self, signum: int) -> None:
        """Pass a signal ``train`` received to this host's part of the job.

        By default every local process gets it (stopping signals with the grace
        period, then SIGKILL), and ``PartStopped`` is posted once all of them
        are gone: the job hears of this host's stop when its whole part has
        stopped, not when its first process ends.  A runner with its own stop
        (``spec.stop``: MPI's ranks are not our children) is asked once, and
        ``PartStopped`` is posted when it returns.
        """
        if signum in STOPPING_SIGNALS and self._spec.stop is not None:
            if not self._stopping:
                self._stopping = True
                in_thread(self._runner_stop, "stop-ranks", signum, list(self.locals))
            return
        forward(self.locals, signum, self._grace_s)
        if signum in STOPPING_SIGNALS and not self._spec.own_end_on_stop:
            in_thread(self._part_stopped, "part-stopped", signum, list(self.locals))

    def stop_for_restart(self, attempt: int) -> None:
        """Stop the part of ``attempt`` (the grace period, then kill); ``PartEnded`` once it is gone."""
        in_thread(self._stop_part, "stop-part", attempt, list(self.locals))

    def _runner_stop(self, signum: int, locals_: list[Local]) -> None:
        assert self._spec.stop is not None
        self._spec.stop(signum, locals_)
        self._events.put(PartStopped(signum, time.time()))  # a stopped job did not complete, whatever its ranks returned

    def _part_stopped(self, signum: int, locals_: list[Local]) -> None:
        for local in locals_:
            local.child.wait()  # each has its grace, and SIGKILL after it (Supervised.stop)
        self._events.put(PartStopped(signum, time.time()))

    def _stop_part(self, attempt: int, locals_: list[Local]) -> None:
        if self._spec.stop_for_restart is not None:
            self._spec.stop_for_restart(locals_)
        stop_locals(locals_, self._grace_s)
        self._events.put(PartEnded(attempt))


def forward(locals_: Sequence[Local], signum: int, grace_s: float) -> None:
    for local in locals_:
        if signum in STOPPING_SIGNALS:
            local.child.stop(signum, grace_s)
        else:
            local.child.send(signum)


def stop_locals(locals_: Sequence[Local], grace_s: float) -> None:
    for local in locals_:
        if local.child.poll() is None:
            local.child.stop(signal.SIGTERM, grace_s)
    for local in locals_:
        local.child.wait(grace_s + 5)
        local.child.finish(linger_s=1.0)


def end_leftovers() -> None:
    ended = end_descendants()
    if ended:
        log(f"ended processes the job left behind: {', '.join(ended)}")


@contextmanager
def signals_held() -> Iterator[None]:
    """Signals wait (at the OS) until the block ends: their handler never runs in the middle of it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _watch(local: Local, events: SimpleQueue, attempt: int) -> None:
    def wait() -> None:
        status = local.child.wait()
        events.put(LocalExit(local.name, status, time.time(), attempt=attempt))

    threading.Thread(target=wait, name=f"watch-{local.name}", daemon=True).start()


def in_thread(target: Callable, name: str, *args) -> None:
    threading.Thread(target=target, args=args, name=name, daemon=True).start()
