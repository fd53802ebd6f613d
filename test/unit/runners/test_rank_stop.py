"""native/rank_stop.c, in a rank: SIGTERMs that come together are one stop; during a stop (a SIGTERM came, or its
host's stop flag exists) MPI_Abort ends the rank alone and MPI_Finalize meets nobody; outside one, both are MPI's.

Each case runs a small Python with the library preloaded, as a rank runs (here with no MPI library loaded: the
real MPI_Abort and MPI_Finalize are then missing, and the library's fallback returns -1).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training_toolkit import native
from training_toolkit.config.settings import RANK_STOP_FLAG_VAR, RANK_STOP_WAIT_VAR

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

CALL = r"""
import ctypes, os, signal, sys
lib = ctypes.CDLL(None)
how, flag = sys.argv[1], sys.argv[2]
if how == "flag":
    open(flag, "w").close()
if how == "signalled":
    signal.signal(signal.SIGTERM, lambda *_: None)
    os.kill(os.getpid(), signal.SIGTERM)
print("finalize", lib.MPI_Finalize(), flush=True)
lib.MPI_Abort(ctypes.c_void_p(0), 143)
print("no MPI here: returned", flush=True)
"""


def run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(native.path_of(native.RANK_STOP_LIBRARY)),
               RANK_STOP_WAIT_VAR: "1000", **env}
    return subprocess.run([sys.executable, "-c", code, *args], env=environ, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("how", ["flag", "signalled"])
def test_during_a_stop_mpi_abort_is_the_ranks_own_exit_and_finalize_meets_nobody(tmp_path: Path, how: str):
    flag = tmp_path / "stopping"
    out = run(CALL, how, str(flag), **{RANK_STOP_FLAG_VAR: str(flag)})
    assert (out.returncode, out.stdout) == (143, "finalize 0\n"), out.stderr


def test_outside_a_stop_both_are_mpis(tmp_path: Path):
    flag = tmp_path / "stopping"
    out = run(CALL, "none", str(flag), **{RANK_STOP_FLAG_VAR: str(flag)})
    assert (out.returncode, out.stdout) == (0, "finalize -1\nno MPI here: returned\n"), out.stderr


def test_without_the_window_the_library_passes_everything(tmp_path: Path):
    """No TRAINING_TOOLKIT_RANK_STOP_WAIT_MS: not a rank; a SIGTERM is no stop of its."""
    flag = tmp_path / "stopping"
    out = run(CALL, "signalled", str(flag), **{RANK_STOP_WAIT_VAR: ""})
    assert (out.returncode, out.stdout) == (0, "finalize -1\nno MPI here: returned\n"), out.stderr


COUNT = r"""
import os, signal, sys, time
calls = []
def handler(signum, frame):
    calls.append(signum)
    os.write(1, f"handler {len(calls)} {signal.getsignal(signal.SIGTERM) is handler}\n".encode())
    if len(calls) == 2:
        os._exit(143)
signal.signal(signal.SIGTERM, handler)
print("ready", flush=True)
time.sleep(30)
"""


def test_the_same_stop_sent_again_runs_the_handler_once():
    """Slurm signals the rank, then its host's train does: the handler (a save) runs once, not a second time inside
    the first; a SIGTERM after the window is the program's again.  Python sees the disposition it set."""
    environ = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(native.path_of(native.RANK_STOP_LIBRARY)),
               RANK_STOP_WAIT_VAR: "1500"}
    proc = subprocess.Popen([sys.executable, "-c", COUNT], env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, out) == (143, "handler 1 True\nhandler 2 True\n"), err
    finally:
        proc.kill()
