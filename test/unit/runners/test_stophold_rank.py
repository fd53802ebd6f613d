"""native/stophold.c, a rank's side: after a SIGTERM, the rank's end waits until its host has decided the stop.

Each case starts a real rank as Open MPI would: ``training-toolkit-rank`` with a rank file (which sets the
rank's own pid, TRAINING_TOOLKIT_RANK_PID), the library preloaded, and a small Python as the user's command.
The test is the platform: it sends the SIGTERM (as Slurm does, before the host's train) and, as the host's
train would, makes the stop flag (or the restart flag) some time later, or never.
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
from training_toolkit.runners import rank_env
from training_toolkit.config.settings import RANK_RESTART_FLAG_VAR, RANK_STOP_FLAG_VAR, RANK_STOP_WAIT_VAR

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

FLAG_AFTER_S = 0.6  # the host's train makes its flag this long after the signal
WAIT_MS = 4000  # the bound, well above FLAG_AFTER_S: an end at FLAG_AFTER_S waited for the flag, not the bound

# what the rank's handler does: MPI_Abort (as `python -m mpi4py` does with a handler's sys.exit(143)), exit, _exit
RANK = r"""
import ctypes, os, signal, subprocess, sys, time
how = sys.argv[1]
calls = []
def handler(signum, frame):
    if how == "count":  # each run of the handler said; the second ends the rank
        calls.append(signum)
        os.write(1, f"handler {len(calls)}\n".encode())
        if len(calls) == 2:
            os._exit(143)
        return
    if how == "abort":
        ctypes.CDLL(None).MPI_Abort(ctypes.c_void_p(0), 143)
        os.write(1, b"no MPI here: returned\n")  # not print(): the signal may come while "ready" is written
        sys.exit(3)
    if how == "exit":
        sys.exit(143)
    os._exit(143)
seen = [signal.getsignal(signal.SIGTERM)]
if how != "default":
    signal.signal(signal.SIGTERM, handler)
    seen.append(signal.getsignal(signal.SIGTERM) is handler)
child = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("ready", child.pid, seen, flush=True)
time.sleep(30)
"""


def start_rank(tmp_path: Path, how: str, wait_ms: int = WAIT_MS) -> tuple[subprocess.Popen, int, str]:
    flag = tmp_path / "stopping"
    env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(native.path_of(native.STOPHOLD_LIBRARY)),
           RANK_STOP_FLAG_VAR: str(flag), RANK_RESTART_FLAG_VAR: str(tmp_path / "restarting"),
           RANK_STOP_WAIT_VAR: str(wait_ms)}
    rank_file = tmp_path / "rank.env"
    rank_env.write_rank_file(rank_file, rank_env.encode_rank_file(str(tmp_path), [sys.executable, "-c", RANK, how],
                                                                  env))
    rank = subprocess.Popen([str(native.path_of(native.RANK_PROGRAM)), str(rank_file)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = rank.stdout.readline().split(" ", 2)
    assert line[0] == "ready", rank.stderr.read()
    return rank, int(line[1]), line[2].strip()


def signal_then_flag(rank: subprocess.Popen, flag: Path | None) -> tuple[float, int, str]:
    """SIGTERM now, ``flag`` made FLAG_AFTER_S later (None: never); how long the rank took to end, its status."""
    start = time.monotonic()
    rank.send_signal(signal.SIGTERM)
    if flag is not None:
        try:
            rank.wait(FLAG_AFTER_S)
        except subprocess.TimeoutExpired:
            flag.touch()
    out, err = rank.communicate(timeout=30)
    return time.monotonic() - start, rank.returncode, out + err


@pytest.mark.parametrize("how", ["abort", "exit", "_exit"])
def test_a_ranks_end_after_sigterm_waits_for_its_hosts_stop_flag(tmp_path: Path, how: str):
    rank, child, seen = start_rank(tmp_path, how)
    try:
        took, code, out = signal_then_flag(rank, tmp_path / "stopping")
        assert seen == "[<Handlers.SIG_DFL: 0>, True]"  # Python sees SIGTERM's disposition as it set it
        assert FLAG_AFTER_S <= took < FLAG_AFTER_S + 2, took
        assert (code, out) == (143, "")  # MPI_Abort during the stop: the rank's own exit, the runtime never told
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_same_stop_sent_again_runs_the_handler_once(tmp_path: Path):
    """Slurm signals the rank, then its host's train does: the handler (a save) runs once, not a second time inside
    the first; a SIGTERM after the window (the wait's length) is the program's again."""
    rank, child, _ = start_rank(tmp_path, "count", wait_ms=1500)
    try:
        rank.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        rank.send_signal(signal.SIGTERM)
        time.sleep(2.0)
        rank.send_signal(signal.SIGTERM)
        out, err = rank.communicate(timeout=30)
        assert (rank.returncode, out) == (143, "handler 1\nhandler 2\n"), err
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_rank_without_a_handler_dies_of_sigterm_once_the_flag_exists(tmp_path: Path):
    rank, child, seen = start_rank(tmp_path, "default")
    try:
        took, code, _ = signal_then_flag(rank, tmp_path / "stopping")
        assert seen == "[<Handlers.SIG_DFL: 0>]"
        assert FLAG_AFTER_S <= took < FLAG_AFTER_S + 2, took
        assert code == -signal.SIGTERM
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_restarts_stop_holds_nothing_back(tmp_path: Path):
    """The restart flag is there before the signal (runners/mpi.py ``stop_part``): the rank ends at once."""
    (tmp_path / "restarting").touch()
    rank, child, _ = start_rank(tmp_path, "abort")
    try:
        took, code, out = signal_then_flag(rank, None)
        assert took < FLAG_AFTER_S, took
        assert (code, out) == (3, "no MPI here: returned\n")  # no stop flag: MPI_Abort is the real one
    finally:
        os.kill(child, signal.SIGKILL)


def test_with_no_decision_the_wait_is_bounded(tmp_path: Path):
    rank, child, _ = start_rank(tmp_path, "abort", wait_ms=500)
    try:
        took, code, out = signal_then_flag(rank, None)
        assert 0.5 <= took < 0.5 + 2, took
        assert (code, out) == (3, "no MPI here: returned\n")
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_ranks_children_are_not_held(tmp_path: Path):
    """A process the rank starts (its own program, not the rank) dies of SIGTERM at once, with no flag at all."""
    rank, child, _ = start_rank(tmp_path, "abort")
    try:
        start = time.monotonic()
        os.kill(child, signal.SIGTERM)
        while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
            assert time.monotonic() - start < FLAG_AFTER_S, "the rank's child waited"
            time.sleep(0.01)
    finally:
        rank.kill()
        rank.communicate()
