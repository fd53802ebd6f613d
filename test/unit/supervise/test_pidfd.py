"""Signals to processes found by a look go through a pidfd, checked against what the look saw (supervise/pidfd.py)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from training_toolkit.supervise import procfs
from training_toolkit.supervise.stopping import stop_processes
from training_toolkit.supervise import pidfd

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)


def test_same_process_is_the_start_time_seen():
    now = procfs.Proc(pid=42, ppid=1, pgid=42, zombie=False, start=1000)
    assert pidfd.same_process(1000, now)
    assert not pidfd.same_process(999, now)  # matched, gone, and its pid given to another: not it
    assert not pidfd.same_process(1000, None)  # gone
    assert pidfd.same_process(None, now)  # nothing seen but the pid: whatever is there


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def replaced(proc: subprocess.Popen) -> procfs.Seen:
    """What a look would have seen had an earlier process held this pid: the same pid, another start time."""
    now = procfs.read(proc.pid)
    assert now is not None
    return procfs.Seen(proc.pid, now.start - 1)


def test_a_process_replaced_since_the_look_is_not_held_and_never_signalled(sleeper):
    assert pidfd.hold(replaced(sleeper)) is None
    assert stop_processes([replaced(sleeper)], 0.1) == []
    assert sleeper.poll() is None  # the sleep on that pid now was never touched


def test_the_process_seen_is_held_and_signalled(sleeper):
    seen = procfs.read(sleeper.pid).seen
    held = pidfd.hold(seen)
    assert held is not None and (held.fd is not None) is pidfd.available()
    assert not held.ended()
    assert held.send(signal.SIGKILL)
    assert sleeper.wait(5) == -signal.SIGKILL
    assert held.ended() and not held.send(signal.SIGKILL)  # ended: nothing more is sent, to it or any other
    held.close()


def test_a_check_after_the_pidfd_can_refuse(sleeper):
    assert pidfd.hold(sleeper.pid, check=lambda pid: False) is None
    assert sleeper.poll() is None


def test_without_pidfds_the_pid_is_checked_again_just_before_the_signal(sleeper):
    """The fallback where pidfd_open is missing (ENOSYS): kill(2) by pid, after the same check."""
    assert pidfd.hold(replaced(sleeper), pidfds=False) is None
    held = pidfd.hold(procfs.read(sleeper.pid).seen, pidfds=False)
    assert held is not None and held.fd is None
    held = held._replace(start=held.start - 1)  # as if the pid had gone to another process since the hold
    assert not held.send(signal.SIGKILL) and sleeper.poll() is None
    assert stop_processes([procfs.read(sleeper.pid).seen], 0.05, signal.SIGKILL) == []
    assert procfs.read(sleeper.pid) is None  # ended, and reaped by the stop (a pid of ours, not the Popen)


def test_marked_descendants_and_with_marker_carry_what_the_look_saw():
    proc = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", "TT_PIDFD_TEST": "x"})
    try:
        import os

        (seen,) = procfs.marked_descendants(os.getpid(), b"TT_PIDFD_TEST=x")
        assert seen == proc.pid and seen.start == procfs.read(proc.pid).start
        assert procfs.with_marker(b"TT_PIDFD_TEST=x") == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
