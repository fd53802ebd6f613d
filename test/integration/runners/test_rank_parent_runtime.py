"""The rank's parent (native/rank_exec.c) with Open MPI's real runtimes: a platform's SIGTERM to every process.

Slurm's scancel and --time signal every process of a job: mpirun (or a daemon), each rank's parent and each rank,
and that may come before the host's train has made the stop flag.  Open MPI ends the whole job when one rank
ends badly (here rank 0 exits 143 at once) and, Open MPI 5's prterun, when it takes a SIGTERM itself (SIGCONT,
0.25 s, SIGTERM, 0.25 s, SIGKILL): a rank whose save takes longer lost it (seen in CI under Slurm).  With the
runtime started with SIGTERM blocked and each rank under its parent, nothing of the runtime's ends a rank: the
parents hold the ends while the host's stop flag exists, and rank 1 saves.  Without them (the ranks mpirun's
own children, Open MPI 5's runtime not blocked) the save is lost: the case that shows what they are for.

Run here without train and on one host: the test makes the stop flag as the host's train would, 0.3 s after
the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.paths import OMPI5_BIN
from training_toolkit import native
from training_toolkit.config.settings import RANK_RESTART_FLAG_VAR, RANK_STOP_FLAG_VAR
from training_toolkit.runners import rank_env
from training_toolkit.runners.mpi_command import BLOCK_SIGTERM
from training_toolkit.runners.one_stop import rank_stop_library, stop_window

RANKS = r"""
import os, signal, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
out = sys.argv[1]
def on_term(signum, frame):
    if rank == 1:
        time.sleep(1.0)  # its save: longer than PRRTE's kill sequence
        open(os.path.join(out, "saved-1"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(out, f"up-{rank}"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(60)
"""

FLAVOURS = [
    pytest.param("mpirun", True, id="openmpi4", marks=pytest.mark.mpi),
    pytest.param(str(OMPI5_BIN / "mpirun"), True, id="openmpi5", marks=pytest.mark.openmpi5),
    pytest.param(str(OMPI5_BIN / "mpirun"), False, id="openmpi5-ranks-on-their-own", marks=pytest.mark.openmpi5),
]


@pytest.mark.parametrize("mpirun, parents", FLAVOURS)
def test_a_sigterm_to_every_process_keeps_every_save(tmp_path: Path, mpirun: str, parents: bool):
    (tmp_path / "ranks.py").write_text(RANKS)
    flag = tmp_path / "stopping"
    env = {"PATH": f"{OMPI5_BIN}:{os.environ['PATH']}" if str(OMPI5_BIN) in mpirun else os.environ["PATH"],
           "HOME": str(tmp_path), "OMPI_MCA_btl": "self,tcp",
           "PRTE_MCA_prte_silence_shared_fs": "1"}
    rank_command = [sys.executable, "ranks.py", str(tmp_path)]
    if parents:
        rank_env.write_rank_file(tmp_path / "rank.env", rank_env.encode_rank_file(str(tmp_path), rank_command, {
            "PATH": os.environ["PATH"], "LD_PRELOAD": rank_stop_library(), RANK_STOP_FLAG_VAR: str(flag),
            RANK_RESTART_FLAG_VAR: str(tmp_path / "restarting"), **stop_window()}))
        rank_command = [str(native.path_of(native.RANK_PROGRAM)), str(tmp_path / "rank.env")]
    command = [*(BLOCK_SIGTERM if parents else ()), mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
               *rank_command]
    runtime = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(ranks) < 2 and time.monotonic() < deadline and runtime.poll() is None:
            time.sleep(0.05)
            ranks = [int(p.read_text()) for p in tmp_path.glob("up-*") if p.read_text()]
        assert len(ranks) == 2, f"the ranks did not start: {runtime.poll()}"
        every = [runtime.pid, *({_parent(pid) for pid in ranks} - {runtime.pid}), *ranks]
        for pid in every:  # every process of the job, as slurmstepd signals a step's
            _signal(pid, signal.SIGTERM)
        time.sleep(0.3)
        flag.touch()  # the host's train heard it too
        deadline = time.monotonic() + 5
        while not (tmp_path / "saved-1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "saved-1").exists() is parents, "rank 1's save"
        if parents:
            assert runtime.poll() is None, "the runtime saw an end during the stop"
            flag.unlink()  # the job's end: the runtime sees its ranks' ends, and ends by itself
            assert runtime.wait(10) is not None
    finally:
        for pid in ranks:
            _kill(pid)
        _kill(-runtime.pid)
        out, _ = runtime.communicate(timeout=30)
        print(out)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _signal(pid: int, signum: int) -> None:
    """As slurmstepd does, a process already gone is passed over: a rank whose parent passed the signal on and
    which ended at once (rank 0) may be reaped before its own turn comes."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    _signal(pid, signal.SIGKILL)
