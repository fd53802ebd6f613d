"""Supervised child processes.

A child runs in its own session (so its own process group): a signal sent to
the group reaches everything the script started, and a terminal's Ctrl-C does
not bypass us.  stdout is inherited untouched (zero copy, zero overhead);
stderr goes through one relay thread that writes every chunk as it was read and
keeps a bounded tail for the failure reason.  While the agent watches for
stalls (``on_output``), stdout goes through a relay thread too, each chunk
written as read: progress is any output, and unwatched jobs pay nothing for it.
``stop`` sends a signal, waits a
grace period, then kills the group; descendants that left the group are found
because the supervisor is their subreaper.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from training_toolkit.supervise import procfs

from training_toolkit.config import settings
from training_toolkit.supervise.stopping import signal_group, stop_processes
from training_toolkit.supervise.deadman import Deadman

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
TAIL_BYTES = 32 * 1024
_PR_SET_CHILD_SUBREAPER = 36
# Marks every descendant of a supervised child, so leftovers that left its
# process group are still found (and processes that are not ours never are):
# the token of the child's dead-man switch (supervise/deadman.py).
TOKEN_VAR = settings.SUPERVISOR_VAR


class ExitStatus(NamedTuple):
    """How a process ended.  ``returncode`` is Popen's: negative for a signal."""

    returncode: int
    killed_by_us: bool = False

    @property
    def signal(self) -> signal.Signals | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode)
        except ValueError:
            return None

    @property
    def exit_code(self) -> int:
        """The shell convention: 128+N for death by signal N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        if self.returncode >= 0:
            return f"exited with code {self.returncode}"
        sig = self.signal
        name = sig.name if sig else f"signal {-self.returncode}"
        if sig == signal.SIGKILL and not self.killed_by_us:
            return f"killed by {name}: likely out of memory (exit code {self.exit_code})"
        if self.killed_by_us:
            return f"killed by {name} after the stop grace period (exit code {self.exit_code})"
        return f"terminated by {name} (exit code {self.exit_code})"


class Tail:
    """The last ``limit`` bytes written, for the failure reason."""

    def __init__(self, limit: int = TAIL_BYTES):
        self._limit = limit
        self._buf = bytearray()
        self._lock = threading.Lock()

    def feed(self, chunk: bytes) -> None:
        with self._lock:
            self._buf += chunk
            if len(self._buf) > 2 * self._limit:
                del self._buf[: len(self._buf) - self._limit]

    def lines(self, count: int = 100) -> list[str]:
        with self._lock:
            data = bytes(self._buf[-self._limit :])
        text = data.decode("utf-8", errors="replace")
        return text.splitlines()[-count:]


def become_subreaper() -> bool:
    """Orphaned descendants of our children get re-parented to us, so we can find and reap them."""
    import ctypes  # deferred: only the CLI's run needs it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Supervised:
    """One child process group, started at construction."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None = None,
        *,
        relay_stderr: bool = True,
        stdout: int | None = None,
        stdin: int | None = subprocess.DEVNULL,
        on_output: Callable[[], None] | None = None,
    ):
        self.argv = list(argv)
        self._on_output = on_output
        relay_stdout = on_output is not None and stdout is None
        self.tail = Tail()
        self._stop_lock = threading.Lock()
        self._stopper: threading.Thread | None = None
        self._killed = False
        self._finished = False
        self._deadman = Deadman()  # ends the child and all that carries its token, should train be killed
        self._token = self._deadman.token
        self.proc = subprocess.Popen(
            self.argv,
            env={**env, **self._deadman.environment()},
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE if relay_stdout else stdout,
            stderr=subprocess.PIPE if relay_stderr else None,
            start_new_session=True,
            close_fds=True,
        )
        self.pid = self.proc.pid
        self._deadman.watch(self.pid)  # and its descendants, those that cleared their environment too
        self._relay: threading.Thread | None = None
        self._stdout_relay: threading.Thread | None = None
        if relay_stderr:
            _widen_pipe(self.proc.stderr.fileno())
            self._relay = threading.Thread(target=self._pump, args=(self.proc.stderr, 2, self.tail),
                                           name=f"stderr-{self.pid}", daemon=True)
            self._relay.start()
        if relay_stdout:
            _widen_pipe(self.proc.stdout.fileno())
            self._stdout_relay = threading.Thread(target=self._pump, args=(self.proc.stdout, 1, None),
                                                  name=f"stdout-{self.pid}", daemon=True)
            self._stdout_relay.start()

    def _pump(self, pipe, out_fd: int, tail: Tail | None) -> None:
        fd = pipe.fileno()
        on_output = self._on_output
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            _write_all(out_fd, chunk)
            if tail is not None:
                tail.feed(chunk)
            if on_output is not None and b"\n" in chunk:
                on_output()
        pipe.close()

    def send(self, sig: int) -> None:
        """Signal the whole group; a group already gone is not an error.

        Only while the child is not reaped: its pid, the group's id, is then still its own and
        cannot name another process's group (after that, ``finish`` ends the group's members one
        by one, through pidfds).
        """
        if self.proc.returncode is None:
            signal_group(self.pid, sig)

    def stop(self, sig: int, grace_s: float) -> None:
        """Ask the group to stop with ``sig``; SIGKILL it if the child is still there after ``grace_s``.

        Returns at once: the grace period runs in the background.  A second
        call only passes its signal on.
        """
        with self._stop_lock:
            if self._stopper is not None:
                self.send(sig)
                return
            self._stopper = threading.Thread(
                target=stop_processes, args=([self.proc], grace_s, sig),
                kwargs={"group": self.pid, "on_kill": self._killing}, name=f"stop-{self.pid}", daemon=True,
            )
            self._stopper.start()

    def _killing(self, pids: list[int]) -> None:
        self._killed = self.pid in pids

    def poll(self) -> ExitStatus | None:
        code = self.proc.poll()
        return None if code is None else ExitStatus(code, killed_by_us=self._killed)

    def wait(self, timeout: float | None = None) -> ExitStatus | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return ExitStatus(code, killed_by_us=self._killed)

    def drain(self, timeout_s: float = 0.5) -> None:
        """Wait (bounded) until its stderr is read to the end, so that the tail holds its last words."""
        if self._relay is not None:
            self._relay.join(timeout=timeout_s)

    def finish(self, linger_s: float = 2.0) -> None:
        """After the main child ended: end whatever it left behind, and drain stderr.

        Members of its group, and descendants re-parented to us (subreaper)
        that carry its token, get SIGTERM, then SIGKILL after ``linger_s``.  Once; again is a no-op.
        """
        if self._finished:
            return
        self._finished = True
        if self._stopper is not None:
            self._stopper.join(timeout=linger_s)  # ends as soon as it sees the child gone
        _end_leftovers(self.proc, self._token, linger_s)
        self._deadman.disarm()
        for relay in (self._relay, self._stdout_relay):
            if relay is not None:
                relay.join(timeout=linger_s)


def _end_leftovers(main: subprocess.Popen, token: str, linger_s: float) -> None:
    """End what a script left: its process group, and descendants carrying its token.

    The script itself stays in the hands of its Popen (should it still run), so
    its exit status is never collected behind its back.
    """
    marker = f"{TOKEN_VAR}={token}".encode()

    def leftovers() -> list[procfs.Proc | subprocess.Popen]:
        return [main if p.pid == main.pid else p for p in procfs.descendants(os.getpid())
                if p.pgid == main.pid or procfs.has_marker(p.pid, marker)]

    # each through its own pidfd, never by the group's id: once the script is reaped, that number is free
    stop_processes(leftovers, linger_s)


def end_descendants(linger_s: float = 1.0) -> list[str]:
    """End every process below us: what the job started here and that outlived its parent.

    Daemons such as Open MPI's ``orted --daemonize`` leave the tree of the
    process that started them; because the toolkit is a subreaper, they are
    re-parented to us, and so still found here.  Returns what had to be ended.
    """

    if not procfs.has_children(os.getpid()):
        return []  # the usual end: nothing below us, known without a scan of every process

    def below() -> list[procfs.Proc]:
        return procfs.descendants(os.getpid())  # each with its start time: signalled only if still that process

    names = [procfs.describe(p.pid) for p in below() if not p.zombie]
    stop_processes(below, linger_s)
    return names


def _widen_pipe(fd: int, size: int = 1 << 20) -> None:
    """A 1 MB pipe lets a chatty script write on while the relay is not scheduled (Linux only)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (OSError, ImportError):
        pass  # over the user's pipe-max-size: the default 64 KB still works


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # our stderr is gone; keep draining the child so it never blocks
        view = view[written:]


class SignalForwarder:
    """Routes the signals ``train`` receives to a callback, and restores the old handlers on exit."""

    def __init__(self, on_signal, signals: Sequence[int] = FORWARDED_SIGNALS):
        self._on_signal = on_signal
        self._signals = tuple(signals)
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "SignalForwarder":
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        self._on_signal(signum)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
