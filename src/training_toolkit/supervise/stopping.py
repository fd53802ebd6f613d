"""Stopping processes: a signal, a grace period, SIGKILL for what is left, and no zombie of ours behind.

Every place that ends processes goes through ``stop_processes`` (a supervised
script's process group, what a script left behind, MPI ranks under sshd, sshd
and its sessions, the hosts of a local cluster), so the rules are the same
everywhere:

- every target gets the signal once, and then SIGCONT, so a stopped (SIGSTOP)
  process can act on it (systemd does the same);
- targets found while waiting (a process may fork) get the signal too, and a
  target once found is followed until it ends, even if the search no longer
  lists it; the stop is done only when a look taken after the last target
  ended finds nothing new (a target may fork just before it ends);
- a zombie counts as gone: it has ended, only its exit status is left;
- after the grace period, what is left gets SIGKILL, and its end is waited
  for (briefly) so its exit status can be collected;
- a process found by pid is held through a pidfd from then on, so a pid
  reused by an unrelated process is never signalled or waited for; a pid
  that comes from a look (a ``procfs.Seen`` or ``procfs.Proc``, with its start
  time) is held only if the process at it is still the one the look saw
  (``supervise.pidfd``), which closes the window between the look and the pidfd;
- exit statuses: a handle (``subprocess.Popen``) is reaped through its own
  ``poll()``, so the status stays its owner's; a pid that is our child (an
  orphan re-parented to us as a subreaper) is reaped with ``waitpid``.  Pass
  the Popen, not its pid, for a process started with subprocess.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from training_toolkit.supervise import pidfd, procfs

#: After SIGKILL, how long to wait for the kernel to end what was killed, so it can be reaped.
KILL_WAIT_S = 1.0

#: A process that ended by a stopping signal before its host's train heard one: how long its end waits for the
#: host's own signal (the agent: ``agent.decisions``; an MPI rank's parent, for its hold: native/rank_exec.c).
#: Slurm (scancel, --time), a terminal's ^C and local's stops signal every process of the job at once, and a
#: handler that exits at once can end before train's own handler has run (seen under Slurm at a load of 25).
STOP_HEARD_S = 2.0

_FIRST_POLL_S = 0.005
_MAX_POLL_S = 0.05
# Signals after which SIGCONT is pointless: they act on a stopped process, or are SIGCONT.
_NO_WAKE = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT})


class Handle(Protocol):
    """A process this program started and owns (``subprocess.Popen`` is one)."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


#: A pid (a ``procfs.Seen`` from a look: checked against it before any signal), a look's ``procfs.Proc``, or a handle.
Target = int | procfs.Proc | Handle


def stop_processes(
    targets: Iterable[Target] | Callable[[], Iterable[Target]],
    grace_s: float,
    sig: int = signal.SIGTERM,
    *,
    group: int | None = None,
    still_ours: Callable[[int], bool] | None = None,
    on_kill: Callable[[list[int]], None] | None = None,
) -> list[int]:
    """Send ``sig`` to ``targets``, wait up to ``grace_s`` for them to end, SIGKILL what is left, reap.

    ``targets``: pids and handles, or a function listing them as they are now;
    it is called again while waiting, so processes started meanwhile are found.
    ``group``: a process group that gets ``sig`` first, and SIGKILL if any
    target is left after the grace period.  ``still_ours(pid)``: asked again,
    through the pidfd, just before a pid is signalled (handles are ours: never
    asked).  ``on_kill(pids)``: called just before SIGKILL goes to the targets
    left (e.g. to note that their death by SIGKILL was ours).

    Returns the pids that had to be killed: empty when every target ended
    within the grace period.  Returns at once when there is nothing to stop.
    """
    find = targets if callable(targets) else _fixed(list(targets))
    if group is not None:
        signal_group(group, sig, wake=True)
    followed: dict[int, _Process] = {}
    try:
        first = True
        deadline = time.monotonic() + grace_s
        delay = _FIRST_POLL_S
        while True:
            for proc in _follow(find(), followed):
                # on the first look, members of ``group`` have had the group's signal
                if not (first and group is not None and _pgid(proc.pid) == group):
                    proc.send(sig, still_ours)
            first = False
            left = [proc for proc in followed.values() if proc.running()]
            if not left:
                # What a target forked after the look above exists by now (its parent has ended):
                # one more look finds it before the stop is called done.
                for proc in _follow(find(), followed):
                    proc.send(sig, still_ours)
                left = [proc for proc in followed.values() if proc.running()]
            if not left:
                return []
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _MAX_POLL_S)
        killed = [proc.pid for proc in left]
        if on_kill is not None:
            on_kill(killed)
        if group is not None:
            signal_group(group, signal.SIGKILL)
        end = time.monotonic() + KILL_WAIT_S
        while left:
            for proc in left:
                proc.send(signal.SIGKILL, still_ours)
            if time.monotonic() >= end:
                break
            time.sleep(_FIRST_POLL_S)
            _follow(find(), followed)  # what was forked in between gets SIGKILL as well
            left = [proc for proc in followed.values() if proc.running()]
        return killed
    finally:
        for proc in followed.values():
            proc.close()


def signal_group(pgid: int, sig: int, *, wake: bool = False) -> None:
    """Signal a process group (then SIGCONT it with ``wake``); a group already gone is not an error."""
    try:
        os.killpg(pgid, sig)
        if wake and sig not in _NO_WAKE:
            os.killpg(pgid, signal.SIGCONT)
    except OSError:
        pass


class _Process:
    """One target followed until it ends: a handle, or a pid held through a pidfd (``supervise.pidfd``)."""

    def __init__(self, target: Target):
        self.handle = None if isinstance(target, (int, procfs.Proc)) else target
        self.pid = _pid_of(target)
        self.held: pidfd.Held | None = None
        self.ended = False
        if self.handle is None:
            seen = target.seen if isinstance(target, procfs.Proc) else target
            self.held = pidfd.hold(seen)  # a pid seen with its start time is held only if still that process
            self.ended = self.held is None

    def running(self) -> bool:
        if not self.ended:
            self.ended = not self._running()
        return not self.ended

    def _running(self) -> bool:
        if self.handle is not None:
            return self.handle.poll() is None  # reaps it, through its owner
        assert self.held is not None
        if not self.held.ended():
            return True
        proc = procfs.read(self.pid)
        if proc is not None and proc.zombie and proc.start == self.held.start and proc.ppid == os.getpid():
            _reap(self.pid)
        return False

    def send(self, sig: int, still_ours: Callable[[int], bool] | None) -> None:
        if self.ended:
            return
        wake = sig not in _NO_WAKE
        try:
            if self.handle is not None:
                self.handle.send_signal(sig)  # Popen: a no-op once it has been reaped
                if wake:
                    self.handle.send_signal(signal.SIGCONT)
            elif self.held is not None and (still_ours is None or still_ours(self.pid)):
                for s in (sig, signal.SIGCONT) if wake else (sig,):
                    self.held.send(s)
        except OSError:
            pass  # it ended meanwhile

    def close(self) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None


def _pid_of(target: Target) -> int:
    return int(target) if isinstance(target, int) else target.pid


def _fixed(targets: list[Target]) -> Callable[[], list[Target]]:
    return lambda: targets


def _follow(found: Iterable[Target], followed: dict[int, _Process]) -> list[_Process]:
    """Start following the targets not followed yet (a pid seen again after its end is a new process)."""
    new = []
    for target in found:
        pid = _pid_of(target)
        known = followed.get(pid)
        if known is None or (known.ended and known.handle is None):
            if known is not None:
                known.close()
            proc = followed[pid] = _Process(target)
            if proc.running():
                new.append(proc)
    return new


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # reaped meanwhile by someone else
