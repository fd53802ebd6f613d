"""This host's part of an attempt: its local processes, their watchers, passing signals on, and their stop.

Each thing that blocks (a process's end, a stop, a stop for a
restart) runs in a thread of its own and ends as an event on the agent's
queue (``LocalExit``, ``PartStopped``, ``PartEnded``): the loop never waits on it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from queue import SimpleQueue

from training_toolkit.agent.events import LocalExit, PartEnded, PartStopped
from training_toolkit.core.log import log
from training_toolkit.supervise import procfs, reported
from training_toolkit.supervise.process import FORWARDED_SIGNALS, STOPPING_SIGNALS, end_descendants
from training_toolkit.supervise.stopping import stop_processes
from training_toolkit.runspec import Local, RunnerSpec


class Part:
    """``locals``: the processes of the current attempt on this host (none on a spare).

    ``watch_dir``: this host's watch directory (every job of more than one seat): the ranks this host did not
    start are reported there, and the stop's flags are made there (``supervise/reported.py``).

    A stop is the same for every runner (``_stop_ranks``): the flag, then the signal to what runs the user's
    program: this host's children that do (``Local.program``) and the reported ranks with what they started;
    the grace period, SIGKILL.  A launcher (``program`` False: mpirun, the parameter server) gets no signal: it
    is ended after its ranks, by the attempt's stack (a stop; on the lead, ``end_launchers`` before the verdict) or
    by ``stop_locals`` (a restart's stop).
    """

    def __init__(self, events: SimpleQueue, spec: RunnerSpec, grace_s: float):
        self._events = events
        self._own_end_on_stop = spec.solo  # a job of one seat: its script's own end is the verdict
        self._grace_s = grace_s
        self.locals: list[Local] = []
        self.watch_dir: Path | None = None
        self._stopping = False  # a stop has begun: later stopping signals change nothing

    def watch(self, attempt: int) -> None:
        """Each local process's end becomes a ``LocalExit`` of ``attempt``."""
        for local in self.locals:
            _watch(local, self._events, attempt)

    def signal(self, signum: int) -> None:
        """Pass a signal ``train`` received to this host's part of the job.

        A stopping signal stops the part (``_stop_ranks``, the stop flag raised: an MPI rank's end is held from
        its runtime); a later one is only passed on to the programs.  ``PartStopped`` is posted when every
        program has ended: the job hears of this host's stop when its whole part has stopped, not when its
        first process ends.  A job of one seat whose
        script's own end is the verdict (``RunnerSpec.solo``) only passes it on.  Any other signal goes to every
        local process (mpirun passes SIGUSR1/2 on to every rank).
        """
        if signum not in STOPPING_SIGNALS or self._own_end_on_stop:
            forward(self.locals, signum, self._grace_s)
            return
        if self._stopping:  # a terminal's second ^C: passed on to the programs, whose stop is under way
            forward([local for local in self.locals if local.program], signum, self._grace_s)
            return
        self._stopping = True
        in_thread(self._stop, "stop-part", signum, list(self.locals), time.time())

    def stop_for_restart(self, attempt: int) -> None:
        """Stop the part of ``attempt`` (the grace period, then kill); ``PartEnded`` once it is gone."""
        in_thread(self._stop_part, "stop-part", attempt, list(self.locals))

    def end_launchers(self) -> None:
        """Every program of the job has stopped: this host's launchers are killed now (mpirun has SIGTERM blocked,
        and a SIGCONT it would pass on to its ranks), rather than with the attempt's stack after the verdict; then
        the ranks' parents held for the stop are let go (no runtime is left to keep their ends from), and reaped."""
        launchers = [local for local in self.locals if not local.program]
        for local in launchers:
            local.child.stop(signal.SIGKILL, 0.0)
        for local in launchers:
            local.child.wait(5.0)
        self.lower_flags()
        stop_locals(launchers, 0.0)

    def lower_flags(self) -> None:
        """Before a restart's barrier: the last attempt's stop holds no end of the next one."""
        if self.watch_dir is not None:
            reported.lower_flags(self.watch_dir)

    def _stop(self, signum: int, locals_: list[Local], at: float) -> None:
        self._stop_ranks(signum, locals_, reported.STOP_FLAG)
        self._events.put(PartStopped(signum, at))  # a stopped job did not complete, whatever its ranks returned

    def _stop_part(self, attempt: int, locals_: list[Local]) -> None:
        self._stop_ranks(signal.SIGTERM, locals_, reported.RESTART_FLAG)  # nothing held: mpirun sees its ranks end
        stop_locals(locals_, self._grace_s)  # then the launchers (and every end reaped)
        self._events.put(PartEnded(attempt))

    def _stop_ranks(self, signum: int, locals_: Sequence[Local], flag: str) -> None:
        """``flag`` raised, then ``signum`` to the programs among ``locals_`` and to the reported ranks, each with
        the grace period and SIGKILL after it; returns once all of them have ended."""
        if self.watch_dir is not None:  # before any signal: a rank's end after it is held (or not) by this flag
            reported.raise_flag(self.watch_dir, flag)
        programs = [local for local in locals_ if local.program]
        for local in programs:
            local.child.stop(signum, self._grace_s)  # returns at once: the grace runs in the background
        if self.watch_dir is not None:
            ranks = self.watch_dir / reported.DIR_NAME
            stop_processes(lambda: reported.targets(ranks), self._grace_s, signum, on_kill=_name_the_left)
        for local in programs:
            local.child.wait(self._grace_s + 5)


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


def _name_the_left(pids: list[int]) -> None:
    """What of the reported ranks was still there at the grace period's end, named before its SIGKILL."""
    log(f"after the grace period, killed: {', '.join(f'{pid} ({procfs.cmdline(pid) or procfs.comm(pid)})' for pid in pids)}")


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
