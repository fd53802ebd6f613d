"""native/stophold.c with Open MPI's real runtimes: a platform's SIGTERM to the runtime and its ranks at once.

Slurm's scancel and --time signal every process of a job: mpirun (or a daemon) as well as its ranks, and that
may come before the host's train has made the stop flag.  Open MPI 5's prterun takes the SIGTERM and ends its
ranks itself (SIGCONT, 0.25 s, SIGTERM, 0.25 s, SIGKILL), so a rank whose save takes longer lost it (seen in CI
under Slurm); Open MPI 4's mpirun starts with SIGTERM blocked (runners/mpi_command.py).  With the library and
the runtime's variables, a SIGTERMed runtime kills nothing from then on, whichever the flavour.

Run here without train and on one host: mpirun starts two ranks of a script whose rank 0 ends at once on SIGTERM
and rank 1 saves after a second; the test signals the runtime and both ranks, as slurmstepd does.
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
from training_toolkit.config.settings import RESTART_FLAG_VAR, STOP_FLAG_VAR

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
    pytest.param(["env", "--block-signal=TERM", "mpirun"], True, id="openmpi4", marks=pytest.mark.mpi),
    pytest.param([str(OMPI5_BIN / "mpirun")], True, id="openmpi5", marks=pytest.mark.openmpi5),
    pytest.param([str(OMPI5_BIN / "mpirun")], False, id="openmpi5-without-the-hold", marks=pytest.mark.openmpi5),
]


@pytest.mark.parametrize("mpirun, held", FLAVOURS)
def test_a_sigterm_to_the_runtime_and_its_ranks_keeps_every_save(tmp_path: Path, mpirun: list[str], held: bool):
    (tmp_path / "ranks.py").write_text(RANKS)
    env = {"PATH": f"{OMPI5_BIN}:{os.environ['PATH']}" if "openmpi5" in str(mpirun) else os.environ["PATH"],
           "HOME": str(tmp_path), "OMPI_MCA_btl": "self,tcp", "PRTE_MCA_prte_silence_shared_fs": "1"}
    if held:
        env.update({"LD_PRELOAD": str(native.path_of(native.STOPHOLD_LIBRARY)),
                    STOP_FLAG_VAR: str(tmp_path / "stopping"), RESTART_FLAG_VAR: str(tmp_path / "restarting")})
    command = [*mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "ranks.py", str(tmp_path)]
    runtime = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(ranks) < 2 and time.monotonic() < deadline and runtime.poll() is None:
            time.sleep(0.05)
            ranks = [int(p.read_text()) for p in tmp_path.glob("up-*") if p.read_text()]
        assert len(ranks) == 2, f"the ranks did not start: {runtime.poll()}"
        for pid in (runtime.pid, *ranks):  # every process of the job, as slurmstepd signals a step's
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not (tmp_path / "saved-1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "saved-1").exists() is held, "rank 1's save"
    finally:
        for pid in ranks:
            _kill(pid)
        _kill(-runtime.pid)
        out, _ = runtime.communicate(timeout=30)
        print(out)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
