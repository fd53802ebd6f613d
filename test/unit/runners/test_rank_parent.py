"""native/rank_exec.c as the rank's parent: it passes the rank's signals and its end on, and during its host's stop
holds that end from Open MPI's runtime (which would end every other rank for it) while the stop flag exists.

Each case starts a rank as Open MPI would: ``training-toolkit-rank`` with a rank file, the rank's library
preloaded (native/rank_stop.c), a small Python as the user's command.  The test is the runtime (it waits for its
child, the parent) and the platform, and, as the host's train would, makes the stop flag or the restart flag.
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
from training_toolkit.config.settings import RANK_RESTART_FLAG_VAR, RANK_STOP_FLAG_VAR, RANK_STOP_WAIT_VAR, RANKS_DIR_VAR
from training_toolkit.supervise import procfs
from training_toolkit.supervise.reported import Reported, reported

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

WAIT_MS = 4000  # the bound on the wait for the host's decision; the tests decide well before it

RANK = r"""
import ctypes, os, signal, sys, time
how = sys.argv[1]
def handler(signum, frame):
    if how == "abort":  # as `python -m mpi4py` does with a handler's sys.exit(143)
        ctypes.CDLL(None).MPI_Abort(ctypes.c_void_p(0), 143)
        os.write(1, b"no MPI here: returned\n")
        os._exit(3)
    os._exit(143)
if how == "usr1":
    signal.signal(signal.SIGUSR1, lambda *_: (os.write(1, b"usr1\n"), os._exit(7)))
elif how != "default":
    signal.signal(signal.SIGTERM, handler)
print("ready", os.getpid(), os.getppid(), os.environ["TRAINING_TOOLKIT_RANK_PID"], flush=True)
if how.startswith("code"):  # ends at once with that code
    os._exit(int(how[4:]))
if how == "leaves":  # ends at once, leaving a daemon: in a session of its own, deaf to SIGTERM, holding its output
    import subprocess
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    print("left", subprocess.Popen([sys.executable, "-c", deaf], start_new_session=True).pid, flush=True)
    os._exit(0)
time.sleep(30)
"""


class Rank:
    def __init__(self, tmp_path: Path, how: str, wait_ms: int = WAIT_MS, reports: Path | None = None,
                 runtime: dict[str, str] | None = None):
        self.flag, self.restart = tmp_path / "stopping", tmp_path / "restarting"
        env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(native.path_of(native.RANK_STOP_LIBRARY)),
               RANK_STOP_FLAG_VAR: str(self.flag), RANK_RESTART_FLAG_VAR: str(self.restart),
               RANK_STOP_WAIT_VAR: str(wait_ms), **({RANKS_DIR_VAR: str(reports)} if reports else {})}
        rank_file = tmp_path / "rank.env"
        rank_env.write_rank_file(rank_file, rank_env.encode_rank_file(str(tmp_path), [sys.executable, "-c", RANK, how],
                                                                      env))
        self.parent = subprocess.Popen([str(native.path_of(native.RANK_PROGRAM)), str(rank_file)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env={**{k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))},
                                            **(runtime or {})})  # what Open MPI's runtime gives it (None: nothing)
        line = self.parent.stdout.readline().split()
        assert line[:1] == ["ready"], self.parent.stderr.read()
        self.pid, parent, named = (int(word) for word in line[1:])
        assert parent == self.parent.pid and named == self.pid  # its child, named so

    def rank_gone(self, within_s: float = 5.0) -> bool:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if not Path(f"/proc/{self.pid}").exists():
                return True
            time.sleep(0.01)
        return False

    def held(self, for_s: float) -> bool:
        try:
            self.parent.wait(for_s)
        except subprocess.TimeoutExpired:
            return True
        return False

    def end(self) -> tuple[int, str]:
        out, err = self.parent.communicate(timeout=30)
        return self.parent.returncode, out + err

    def close(self) -> None:
        for pid in (self.pid, self.parent.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.parent.communicate()


@pytest.fixture
def ranks(tmp_path: Path):
    made: list[Rank] = []
    yield lambda how, **kw: made.append(Rank(tmp_path, how, **kw)) or made[-1]
    for rank in made:
        rank.close()


@pytest.mark.parametrize("how, status", [("code0", 0), ("code3", 3)])
def test_outside_a_stop_the_ranks_end_is_passed_on_as_its_own(ranks, how: str, status: int):
    rank = ranks(how)
    assert rank.end() == (status, "")


def test_a_death_by_a_signal_is_passed_on_as_the_same_death(ranks):
    rank = ranks("sleep")
    os.kill(rank.pid, signal.SIGKILL)
    assert rank.end() == (-signal.SIGKILL, "")


def test_what_the_rank_leaves_running_is_ended_as_the_rank_ends(ranks):
    """Open MPI waits for a rank's output to close as well as for its end: a daemon holding it kept the job running
    for ever.  The parent is the rank's subreaper: it ends what the rank left (SIGTERM, a second, SIGKILL), then
    passes the rank's end on."""
    rank = ranks("leaves")
    t0 = time.monotonic()
    status, out = rank.end()  # read to the end of the output, which the daemon held open
    assert status == 0 and out.startswith("left "), out
    assert not Path(f"/proc/{out.split()[1]}").exists()  # killed, and reaped by the parent
    assert time.monotonic() - t0 < 10


def test_the_runtimes_signals_reach_the_rank(ranks):
    """mpirun passes SIGUSR1 and SIGUSR2 to its own children: here the parent, which passes them on."""
    rank = ranks("usr1")
    rank.parent.send_signal(signal.SIGUSR1)
    assert rank.end() == (7, "usr1\n")


@pytest.mark.parametrize("how, status", [("abort", 143), ("exit", 143), ("default", -signal.SIGTERM)])
def test_during_its_hosts_stop_the_ranks_end_is_held_until_the_flag_goes(ranks, how: str, status: int):
    """The host's train makes the flag, then signals the rank: the rank ends (MPI_Abort: its own exit), its parent
    stays while the flag exists, then passes the end on as the rank's (train removes the flag at the job's end)."""
    rank = ranks(how)
    rank.flag.touch()
    os.kill(rank.pid, signal.SIGTERM)
    assert rank.rank_gone()
    assert rank.held(1.0)
    rank.flag.unlink()
    assert rank.end() == (status, "")


@pytest.mark.parametrize("signalled, how", [("parent", "exit"), ("rank", "abort")])
def test_a_stop_the_platform_signals_first_waits_for_the_hosts_decision(ranks, signalled: str, how: str):
    """Slurm signals every process before the host's train has made its flag, in a pass that is not atomic: the
    parent first (it passes the SIGTERM on), or the rank alone first (its library tells the parent).  The rank ends
    at once; its end waits for the flag (then held) rather than reach the runtime first."""
    rank = ranks(how)
    os.kill(rank.parent.pid if signalled == "parent" else rank.pid, signal.SIGTERM)
    assert rank.rank_gone()
    assert rank.held(0.5)  # the host's train makes its flag half a second later
    rank.flag.touch()
    assert rank.held(1.0)
    rank.flag.unlink()
    assert rank.end() == (143, "")


def test_a_restarts_stop_holds_nothing(ranks):
    """The restart flag (agent/parts.py, a restart's stop): the runtime is to see every end, at once."""
    rank = ranks("abort")
    rank.restart.touch()
    start = time.monotonic()
    os.kill(rank.pid, signal.SIGTERM)
    assert rank.end() == (143, "")
    assert time.monotonic() - start < 1.0


def test_with_no_decision_the_wait_is_bounded(ranks):
    rank = ranks("exit", wait_ms=500)
    start = time.monotonic()
    os.kill(rank.pid, signal.SIGTERM)
    assert rank.end() == (143, "")
    assert 0.5 <= time.monotonic() - start < 2.5


@pytest.mark.parametrize("runtime, rank", [({"OMPI_COMM_WORLD_RANK": "5", "PMIX_RANK": "9"}, 5),  # Open MPI's own
                                           ({"PMIX_RANK": "9"}, 9), ({}, None)])
def test_the_parent_reports_its_rank_to_its_hosts_train_until_the_rank_ends(ranks, tmp_path, runtime, rank):
    """Where the rank file names a directory, the rank's pid, job-wide rank and start time are there while it runs
    (its host's train finds it although it is not its child), and gone once it has ended."""
    reports = tmp_path / "ranks"
    reports.mkdir()
    started = ranks("sleep", reports=reports, runtime=runtime)
    proc = procfs.read(started.pid)
    assert proc is not None
    assert reported(reports) == [Reported(started.pid, rank, proc.start)]
    assert sorted(p.name for p in reports.iterdir()) == [str(started.pid)]
    os.kill(started.pid, signal.SIGKILL)
    assert started.end() == (-signal.SIGKILL, "")
    assert list(reports.iterdir()) == []


def test_a_report_that_cannot_be_written_is_said_and_the_rank_runs_all_the_same(ranks, tmp_path):
    rank = ranks("code3", reports=tmp_path / "missing")
    code, output = rank.end()
    assert code == 3
    assert f"training-toolkit-rank: cannot report rank {rank.pid} in {tmp_path / 'missing'}: No such file" in output
