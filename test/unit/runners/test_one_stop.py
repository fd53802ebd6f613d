"""one_stop.py and native/rank_stop.c for a process the toolkit starts itself (not an MPI rank): where the platform
signals every process (Slurm), its SIGTERMs within the window are one stop, and nothing of its end waits."""

from __future__ import annotations

import pytest
import os
import signal
import subprocess
import sys
import time

from training_toolkit import native
from training_toolkit.runners.one_stop import one_stop_environment
from training_toolkit.config.settings import RANK_PID_VAR, RANK_STOP_WAIT_VAR

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

SCRIPT = r"""
import os, signal, subprocess, sys, time
how = sys.argv[1]
runs = []
def handler(signum, frame):
    runs.append(signum)
    os.write(1, f"handler {len(runs)}\n".encode())
    if how == "exit" or len(runs) == 2:
        sys.exit(143)
signal.signal(signal.SIGTERM, handler)
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get(%r))" % sys.argv[2]],
                       capture_output=True, text=True).stdout.strip()
print("ready", os.environ.get(sys.argv[2]) == str(os.getpid()), child == str(os.getpid()), flush=True)
time.sleep(30)
"""


def start(how: str, wait_ms: int = 1500, env: dict | None = None) -> subprocess.Popen:
    base = {"PATH": os.environ["PATH"], "LD_PRELOAD": "/nonexistent-user-lib.so"}
    env = one_stop_environment(base) if env is None else env
    env[RANK_STOP_WAIT_VAR] = str(wait_ms)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, how, RANK_PID_VAR], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready True True\n", proc.stderr.read()  # itself named, and what it started sees so
    return proc


def test_the_environment_keeps_the_users_preload_first():
    env = one_stop_environment({"LD_PRELOAD": "/u.so", "A": "b"})
    assert env == {"LD_PRELOAD": f"/u.so:{native.path_of(native.RANK_STOP_LIBRARY)}", "A": "b",
                   RANK_STOP_WAIT_VAR: "2000"}


def sigterms(proc: subprocess.Popen, *after_s: float) -> tuple[int, str, str]:
    """SIGTERM now and after each of ``after_s``; the process's status and output."""
    proc.send_signal(signal.SIGTERM)
    for pause in after_s:
        time.sleep(pause)
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err


def test_the_same_stop_sent_again_runs_the_handler_once():
    """The platform's SIGTERM and its host's train's, 0.2 s apart: one run; one after the window: the script's again."""
    code, out, err = sigterms(start("count"), 0.2, 2.0)
    assert (code, out) == (143, "handler 1\nhandler 2\n"), err


def test_without_the_library_python_runs_the_handler_again():
    """What the library is for: the same two SIGTERMs run a plain Python's handler twice."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.replace("ready", "up"), "count", RANK_PID_VAR],
                            env={"PATH": os.environ["PATH"]}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("up")
    code, out, err = sigterms(proc, 0.2)
    assert (code, out) == (143, "handler 1\nhandler 2\n"), err


def test_its_end_waits_for_nothing():
    """No MPI stop flag: the handler's exit ends the process at once, not after the window."""
    proc = start("exit", wait_ms=5000)
    started = time.monotonic()
    code, out, err = sigterms(proc)
    assert (code, out) == (143, "handler 1\n"), err
    assert time.monotonic() - started < 2.0


def test_the_spec_gives_it_to_the_scripts_processes_only_when_on():
    from training_toolkit.runners.one_stop import with_one_stop
    from training_toolkit.runspec import Proc, RunnerSpec

    script, server = Proc("script", ("python", "s.py"), {"A": "b"}), Proc("ps", ("python", "p.py"), {}, program=False)
    spec = RunnerSpec(processes=lambda seat: [script, server])
    assert with_one_stop(spec, False) is spec
    started = with_one_stop(spec, True).processes(None)
    assert started == [Proc("script", ("python", "s.py"), one_stop_environment({"A": "b"})), server]
