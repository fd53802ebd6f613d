"""Supervised children stopped with a grace period, and what they leave behind ended (real processes)."""

from __future__ import annotations

import pytest
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from training_toolkit.supervise import procfs
from training_toolkit.supervise.process import Supervised, end_descendants

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)


def ready(child: Supervised) -> None:
    assert child.proc.stdout is not None
    assert child.proc.stdout.readline() == b"ready\n"


def test_stop_gives_the_grace_period_then_kills_the_group_and_says_so():
    child = Supervised(["/bin/sh", "-c", 'trap "" TERM; sleep 100 & echo ready; wait'], dict(os.environ),
                       stdout=subprocess.PIPE, relay_stderr=False)
    ready(child)
    began = time.monotonic()
    child.stop(signal.SIGTERM, grace_s=0.5)
    status = child.wait(10)
    assert 0.5 <= time.monotonic() - began < 10
    assert status is not None and status.killed_by_us and status.signal == signal.SIGKILL
    assert "after the stop grace period" in status.describe()
    child.finish(linger_s=0.5)
    left = [procfs.describe(p.pid) for p in procfs.descendants(os.getpid()) if not p.zombie]
    assert not left


def test_a_script_that_stops_in_time_gets_the_signal_once(tmp_path: Path):
    counter = tmp_path / "count"
    script = (f"import signal, sys, time\n"
              f"def stop(*_):\n    open({str(counter)!r}, 'a').write('x')\n    time.sleep(0.2)\n    sys.exit(3)\n"
              f"signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(100)\n")
    child = Supervised([sys.executable, "-c", script], dict(os.environ), stdout=subprocess.PIPE, relay_stderr=False)
    ready(child)
    child.stop(signal.SIGTERM, grace_s=30)
    status = child.wait(10)
    assert status is not None and status.returncode == 3 and not status.killed_by_us
    child.finish()
    assert counter.read_text() == "x"


# Run in a child python that is a subreaper, as `train` is: orphans come to it, not to pytest.
FINISH = r"""
import json, os, subprocess, sys, time
from training_toolkit.supervise import procfs
from training_toolkit.supervise.process import Supervised, become_subreaper
assert become_subreaper()
script = "sleep 100 & setsid sh -c 'trap \"\" TERM; exec sleep 100' & echo ready"
child = Supervised(["/bin/sh", "-c", script], dict(os.environ), stdout=subprocess.PIPE, relay_stderr=False)
assert child.proc.stdout.readline() == b"ready\n"
assert child.wait(10).ok
deadline = time.monotonic() + 10
while len([p for p in procfs.descendants(os.getpid()) if not p.zombie and procfs.comm(p.pid) == "sleep"]) < 2:
    assert time.monotonic() < deadline, "the leftovers never exec'd sleep"
    time.sleep(0.01)  # both exec'd: the setsid'd shell's trap was set before, and an ignored SIGTERM survives exec
left = [p.pid for p in procfs.descendants(os.getpid()) if not p.zombie and procfs.comm(p.pid) == "sleep"]
began = time.monotonic()
child.finish(linger_s=0.3)
print(json.dumps({"left": len(left), "seconds": time.monotonic() - began,
                  "after": [p.pid for p in procfs.descendants(os.getpid())]}))
"""


def test_finish_ends_what_the_script_left_in_its_group_and_outside_it():
    # One leftover stays in the script's group; one starts its own session and ignores SIGTERM:
    # the supervisor's token in its environment finds it.
    import json

    out = subprocess.run([sys.executable, "-c", FINISH], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["left"] == 2
    assert 0.3 <= result["seconds"] < 10  # one of them needed SIGKILL after the linger
    assert result["after"] == []  # ended and reaped


def test_end_descendants_names_and_ends_everything_below_us():
    proc = subprocess.Popen(["/bin/sh", "-c", 'trap "" TERM; echo ready; exec sleep 100'], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    assert [name.split()[0] for name in end_descendants(linger_s=0.2)] == [str(proc.pid)]
    assert not procfs.alive(proc.pid)
    assert procfs.read(proc.pid) is None  # reaped: a child of ours
    proc.stdout.close()


def test_finish_runs_once(monkeypatch):
    """A restart's stop finishes the last attempt's processes, and the attempt's stack at the next barrier asks again:
    the second call does nothing (no second scan for what they left)."""
    from training_toolkit.supervise import process

    child = Supervised(["/bin/true"], dict(os.environ))
    child.wait(10)
    scans = []
    real = process._end_leftovers
    monkeypatch.setattr(process, "_end_leftovers", lambda *args: (scans.append(args), real(*args)))
    child.finish(linger_s=0.5)
    child.finish(linger_s=0.5)
    assert len(scans) == 1
