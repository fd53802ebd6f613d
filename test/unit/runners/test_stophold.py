"""native/stophold.c: while its flag file exists, the runtime's kill() and waitpid() are held, a rank's MPI_Abort exits.

Each case runs a small Python with the library preloaded (as mpirun and the daemons run, or as a rank).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from training_toolkit import native
from training_toolkit.config.settings import RANK_STOP_FLAG_VAR, RESTART_FLAG_VAR, STOP_FLAG_VAR

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

# a "runtime": starts a child, then signals and waits for it with the flag there, then without
RUNTIME = r"""
import os, signal, subprocess, sys, time
flag = sys.argv[1]
child = subprocess.Popen(["sleep", "30"])
open(flag, "w").close()
os.kill(child.pid, signal.SIGKILL)                  # held: sends nothing
time.sleep(0.2)
print("alive after kill:", open(f"/proc/{child.pid}/stat").read().split()[2] != "Z")
os.kill(os.getpid(), 0)                             # signal 0, and to itself: never held
child.terminate()                                   # held as well (subprocess calls kill)
time.sleep(0.1)
os.remove(flag)
os.kill(child.pid, signal.SIGKILL)                  # the stop is over: sent
time.sleep(0.2)
open(flag, "w").close()
print("waitpid while held:", os.waitpid(child.pid, os.WNOHANG))   # its end is not seen
os.remove(flag)
print("waitpid after:", os.waitpid(child.pid, 0)[1] == signal.SIGKILL)
"""

ABORT = r"""
import ctypes, sys
lib = ctypes.CDLL(None)
if sys.argv[1] == "flag":
    open(sys.argv[2], "w").close()
print("abort", flush=True)
lib.MPI_Abort(ctypes.c_void_p(0), 143)
print("no MPI here: returned", flush=True)
"""


def run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(native.path_of(native.STOPHOLD_LIBRARY)), **env}
    return subprocess.run([sys.executable, "-c", code, *args], env=environ, capture_output=True, text=True, timeout=30)


def test_the_runtime_kills_nothing_and_sees_no_end_while_the_flag_exists(tmp_path: Path):
    flag = tmp_path / "stopping"
    out = run(RUNTIME, str(flag), **{STOP_FLAG_VAR: str(flag)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["alive after kill: True", "waitpid while held: (0, 0)", "waitpid after: True"]


def test_without_the_variable_nothing_is_held(tmp_path: Path):
    flag = tmp_path / "stopping"
    out = run(RUNTIME, str(flag))
    assert out.stdout.splitlines()[0] == "alive after kill: False", out.stderr


def test_a_ranks_mpi_abort_during_a_stop_is_its_own_exit(tmp_path: Path):
    flag = tmp_path / "stopping"
    out = run(ABORT, "flag", str(flag), **{RANK_STOP_FLAG_VAR: str(flag)})
    assert (out.returncode, out.stdout) == (143, "abort\n"), out.stderr


def test_outside_a_stop_mpi_abort_is_the_real_one(tmp_path: Path):
    """No flag file: passed on (here no MPI library is loaded, so the call fails instead of aborting)."""
    flag = tmp_path / "stopping"
    out = run(ABORT, "none", str(flag), **{RANK_STOP_FLAG_VAR: str(flag)})
    assert (out.returncode, out.stdout) == (0, "abort\nno MPI here: returned\n"), out.stderr


FINALIZE = r"""
import ctypes, sys
if sys.argv[1] == "flag":
    open(sys.argv[2], "w").close()
print("finalize", ctypes.CDLL(None).MPI_Finalize(), flush=True)
"""


def test_a_ranks_mpi_finalize_during_a_stop_returns_at_once(tmp_path: Path):
    """No meeting with peers whose ends the held runtime never reports (Open MPI 4 waited for them to the grace)."""
    flag = tmp_path / "stopping"
    out = run(FINALIZE, "flag", str(flag), **{RANK_STOP_FLAG_VAR: str(flag)})
    assert (out.returncode, out.stdout) == (0, "finalize 0\n"), out.stderr
    flag.unlink()
    out = run(FINALIZE, "none", str(flag), **{RANK_STOP_FLAG_VAR: str(flag)})  # outside a stop: the real one
    assert (out.returncode, out.stdout) == (0, "finalize -1\n"), out.stderr  # (no MPI library here)


# a "runtime" that a platform's stop reaches before its host's train has made the flag: it takes the SIGTERM (a
# handler, as Open MPI 5's prterun and prted) or has it waiting (blocked, as Open MPI 4's mpirun and orted start)
SIGTERMED_RUNTIME = r"""
import os, signal, subprocess, sys, time
child = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
def on_term(signum, frame):  # as PRRTE's: a SIGTERM ends the job's processes
    os.kill(child.pid, signal.SIGKILL)
if sys.argv[1] == "taken":
    signal.signal(signal.SIGTERM, on_term)
else:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("handler", signal.getsignal(signal.SIGTERM) is (on_term if sys.argv[1] == "taken" else signal.SIG_DFL))
os.kill(os.getpid(), signal.SIGTERM)  # (to itself: never held)
os.kill(child.pid, signal.SIGKILL)
time.sleep(0.2)
print("alive", open(f"/proc/{child.pid}/stat").read().split()[2] != "Z")
print("waitpid", os.waitpid(child.pid, os.WNOHANG) != (0, 0))
"""


@pytest.mark.parametrize("how", ["taken", "waiting"])
@pytest.mark.parametrize("restarting", [False, True], ids=["stop", "restart"])
def test_a_sigtermed_runtime_holds_unless_its_host_restarts(tmp_path: Path, how: str, restarting: bool):
    """A SIGTERM holds the runtime from then on, flag or not (the platform signals every process: Slurm's scancel and
    --time), but not under the restart flag: that SIGTERM is its host's train ending it for a restart."""
    restart = tmp_path / "restarting"
    if restarting:
        restart.touch()
    out = run(SIGTERMED_RUNTIME, how, **{STOP_FLAG_VAR: str(tmp_path / "stopping"), RESTART_FLAG_VAR: str(restart)})
    lines = out.stdout.splitlines()
    if lines and lines[0].isdigit():
        _end(int(lines[0]))
    assert out.returncode == 0, out.stderr
    assert lines[1:] == ["handler True", f"alive {not restarting}", f"waitpid {restarting}"]


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
