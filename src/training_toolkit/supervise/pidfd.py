"""Signalling a process found by a look, without a PID-reuse window.

A look (``procfs``) sees a pid and the start time it had then (``procfs.Seen``).  Between the look
and a signal the process may end, be reaped, and its pid go to an unrelated process: a signal by
that bare pid would hit it.  So every signal to a process that is not our own unreaped child goes
the same way:

1. open a pidfd for the pid (``os.pidfd_open``): from now on the descriptor names one process,
   whatever happens to the number;
2. read the process at that pid again: it must be the one the look saw (``same_process``: the same
   start time; a caller may ask more, e.g. still in our cluster's network namespace);
3. signal through the pidfd (``signal.pidfd_send_signal``): a process that has ended since gets
   nothing (ESRCH), and no other process can.

If step 2 passes, the pidfd names the process the look saw: that process had the pid from the look
until the check, so it is the one step 1 opened.

Where ``pidfd_open`` does not exist (ENOSYS: Linux before 5.3, some sandboxes) the fallback is the
same check repeated just before each ``kill(2)`` by pid: the window shrinks to microseconds but is
not closed.  Each ``hold`` finds out by trying (nothing is probed at import); ``available()`` says which
applies here.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable
from typing import NamedTuple

from training_toolkit.supervise import procfs


def available() -> bool:
    """Whether this kernel (and Python) gives pidfds; without them signals go by pid, checked just before."""
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):
        return False


def same_process(seen_start: int | None, now: procfs.Proc | None) -> bool:
    """Whether the process now at a pid is the one a look saw there: it exists and started when that
    one did (a pid's start time is set once, at fork: two processes on one pid never share it).
    ``seen_start`` None: nothing was seen but the pid; any process there is taken."""
    return now is not None and (seen_start is None or now.start == seen_start)


class Held(NamedTuple):
    """A process held for signalling: its pidfd (None without pidfds), its pid and start time."""

    fd: int | None
    pid: int
    start: int

    def send(self, sig: int) -> bool:
        """Signal it; False once it has ended (never another process)."""
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
                return True
            if not same_process(self.start, procfs.read(self.pid)):
                return False
            os.kill(self.pid, sig)  # no pidfd: the window between the check above and this call remains
            return True
        except ProcessLookupError:
            return False

    def ended(self) -> bool:
        """Whether it has ended (a zombie has: only its exit status is left)."""
        if self.fd is not None:
            return _readable(self.fd)  # a pidfd turns readable once its process has ended
        now = procfs.read(self.pid)
        return not same_process(self.start, now) or bool(now and now.zombie)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def hold(pid: int, seen_start: int | None = None, check: Callable[[int], bool] | None = None, *,
         pidfds: bool = True) -> Held | None:
    """Hold the process at ``pid`` if it is still the one seen (``seen_start``; a ``procfs.Seen``
    carries its own) and passes ``check``; None when it is gone or another one.  ``pidfds=False``, or
    a kernel or Python without ``pidfd_open``: the fallback (no descriptor; the pid checked again before a signal)."""
    if seen_start is None:
        seen_start = getattr(pid, "start", None)
    pid = int(pid)
    fd = None
    if pidfds and hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                raise
    now = procfs.read(pid)  # after the pidfd: if this is the process seen, the pidfd is that process's
    if not same_process(seen_start, now) or (check is not None and not check(pid)):
        if fd is not None:
            os.close(fd)
        return None
    assert now is not None
    return Held(fd, pid, now.start)


def _readable(fd: int) -> bool:
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
