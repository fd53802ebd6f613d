"""A stop is the agent's: every rank gets its SIGTERM handler and the grace, whichever ends first.

SIGTERM to every host's train (a platform's stop: SageMaker's, a spot interruption, ``local``'s),
ranks whose handlers take different times (0 s, 0.5 s, several seconds; rank 0 the slow one too):
every rank's save is kept, every host ends 143 "stopped by SIGTERM", long before the grace is over,
and nothing is left running.  A rank that fails while the others run still ends the job at once.

The handlers are of different lengths on purpose: with equal ones, a runtime or a verdict that ends
the job when the first rank is done hides behind the others being done too.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from helpers.jobrecord import of_kind, record_at
from helpers.multihost import hps, run, source_dir
from helpers.paths import FIXTURES, OMPI5_BIN, TOOLKIT_PYTHON
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root]

HOSTS = ("algo-1", "algo-2")
RANKS = 4
GRACE_S = 30.0  # far longer than any handler: a stop that waits for it is a failure of this test too
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30"}


def stop_all_once_up(tmp_path: Path, ranks: int = RANKS):
    """An on_start hook: SIGTERM to every host's train once every rank is waiting; when it was sent, in ``sent``."""
    sent: list[float] = []

    def on_start(procs):
        def later():
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if len(list((tmp_path / "cluster").glob("algo-*/opt/ml/model/waiting-*"))) == ranks:
                    break
                time.sleep(0.05)
            sent.append(time.monotonic())
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
        threading.Thread(target=later, daemon=True).start()
    return on_start, sent


def check_stopped(results, sent: list[float], delays: list[float]) -> None:
    saved = sorted(p.name for r in results for p in r.model_dir.glob("saved-*"))
    assert saved == [f"saved-{i}" for i in range(RANKS)], (saved, [(r.host, r.failure) for r in results])
    for r in results:
        assert r.exit_code == 143, (r.host, r.exit_code, r.failure)
        assert "stopped by SIGTERM" in r.failure.splitlines()[0], r.failure
    for r in results:  # each host's record: the stop; a save's exit 143 is the stop's, not a failure of its own
        faults = of_kind(record_at(r.opt_ml, r.host), "fault")
        assert faults and {f["fault"] for f in faults} == {"stop"}, (r.host, faults)
    took = max(r.ended_at for r in results) - sent[0]
    # every handler had its time, and the stop ended with the slowest one, not with the grace
    assert max(delays) <= took < max(delays) + 12, f"the stop took {took:.1f} s (handlers: {delays})"


def runtime_quiet(out: str) -> None:
    """A stopped MPI job's output holds nothing of Open MPI's runtime: no help block (its lines of dashes, such as
    ORTE's "unable to reliably start one or more daemons", printed when the other hosts left before mpirun did),
    and no "Forwarding signal" (a SIGCONT passed on)."""
    said = [line for line in out.splitlines() if re.search(r"-{40}|Forwarding signal", line)]
    assert not said, said


def mpi_job(src: Path, program: str, delays: list[float], env=None) -> LocalJob:
    return LocalJob(hosts=HOSTS, hyperparameters=hps(program, src, sagemaker_mpi_enabled=True,
                                                     sagemaker_mpi_num_of_processes_per_host=2),
                    env={**FAST, "SAVE_DELAYS": ",".join(map(str, delays)), **(env or {})})


#: rank 3 slow (the first host's ranks end first), and rank 0 slow (a worker's ranks end first)
DELAYS = {"last-slow": [0, 0.5, 0, 3], "first-slow": [3, 0, 0.5, 0]}


@pytest.mark.mpi
@pytest.mark.sshd
@pytest.mark.parametrize("mpi4py", [True, False], ids=["mpi4py", "no-mpi-init"])
@pytest.mark.parametrize("order", sorted(DELAYS))
def test_mpi_stop_keeps_every_ranks_save(tmp_path, order, mpi4py, capfd):
    """Open MPI 4.  With mpi4py a handler's sys.exit(143) is MPI_Abort (``python -m mpi4py``); without, a non-zero exit."""
    delays = DELAYS[order]
    src = source_dir(tmp_path, "slow_save.py")
    on_start, sent = stop_all_once_up(tmp_path)
    job = mpi_job(src, "slow_save.py", delays, env={"USE_MPI4PY": "1"} if mpi4py else None)
    results = run(job, tmp_path, timeout_s=120, stop_grace_s=GRACE_S, on_start=on_start)
    check_stopped(results, sent, delays)
    runtime_quiet(capfd.readouterr().out)


@pytest.mark.mpi
@pytest.mark.sshd
def test_mpi_stop_with_ranks_that_have_no_handler(tmp_path):
    """Ranks 1-3 die of SIGTERM at once (no handler): rank 0, saving, is not killed with them."""
    delays = [3, 0, 0, 0]
    src = source_dir(tmp_path, "slow_save.py")
    on_start, sent = stop_all_once_up(tmp_path)
    job = mpi_job(src, "slow_save.py", delays, env={"USE_MPI4PY": "1", "NO_HANDLER": "1,2,3"})
    results = run(job, tmp_path, timeout_s=120, stop_grace_s=GRACE_S, on_start=on_start)
    saved = sorted(p.name for r in results for p in r.model_dir.glob("saved-*"))
    assert saved == ["saved-0"], saved
    for r in results:
        assert r.exit_code == 143, (r.host, r.exit_code, r.failure)
        assert "stopped by SIGTERM" in r.failure.splitlines()[0], r.failure


@pytest.mark.mpi
@pytest.mark.openmpi5
@pytest.mark.sshd
@pytest.mark.parametrize("order", sorted(DELAYS))
def test_openmpi5_stop_keeps_every_ranks_save(tmp_path, order, capfd):
    """Open MPI 5 (PRRTE aborts on a non-zero exit by default); the ranks do not load mpi4py (built for 4)."""
    delays = DELAYS[order]
    src = tmp_path / "src"
    src.mkdir()
    (src / "slow_save").write_text(f"#!{TOOLKIT_PYTHON}\n" + (FIXTURES / "slow_save.py").read_text())
    (src / "slow_save").chmod(0o755)
    on_start, sent = stop_all_once_up(tmp_path)
    job = mpi_job(src, "slow_save", delays, env={"PATH": f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"})
    results = run(job, tmp_path, timeout_s=120, stop_grace_s=GRACE_S, on_start=on_start)
    check_stopped(results, sent, delays)
    runtime_quiet(capfd.readouterr().out)


@pytest.mark.mpi
@pytest.mark.sshd
def test_a_failing_mpi_rank_still_ends_the_job_at_once(tmp_path):
    """Not a stop: rank 1 exits 1 while the others wait 60 s; mpirun ends the job, every host fails."""
    src = source_dir(tmp_path, "slow_save.py")
    t0 = time.monotonic()
    results = run(mpi_job(src, "slow_save.py", [0], env={"FAIL_RANK": "1"}), tmp_path, timeout_s=120,
                  stop_grace_s=GRACE_S)
    ended = max(r.ended_at for r in results) - t0
    assert ended < 30, f"the job took {ended:.1f} s to end after a rank failed"
    for r in results:
        assert r.exit_code == 1, (r.host, r.exit_code, r.failure)
        assert "rank 1" in r.failure.splitlines()[0], r.failure


def torch_job(src: Path, delays: list[float], env=None) -> LocalJob:
    return LocalJob(hosts=HOSTS, hyperparameters=hps("slow_save.py", src, sagemaker_torch_distributed_enabled=True,
                                                     sagemaker_distributed_processes_per_host=2),
                    env={**FAST, "SAVE_DELAYS": ",".join(map(str, delays)), **(env or {})})


@pytest.mark.parametrize("delays", [[10, 0, 0.5, 0], [0, 0.5, 0, 10]], ids=["first-slow", "last-slow"])
def test_torch_distributed_stop_keeps_every_ranks_save(tmp_path, delays):
    """The processes are each host's own; a verdict reached when the first host's part stopped must not end the rest.

    10 s: longer than what a host that heard the verdict gave its processes before (2 s, then 5 s for them to end).
    """
    src = source_dir(tmp_path, "slow_save.py")
    on_start, sent = stop_all_once_up(tmp_path)
    results = run(torch_job(src, delays), tmp_path, timeout_s=120, stop_grace_s=GRACE_S, on_start=on_start)
    check_stopped(results, sent, delays)


def test_a_failing_torch_distributed_process_still_ends_the_job_at_once(tmp_path):
    src = source_dir(tmp_path, "slow_save.py")
    t0 = time.monotonic()
    results = run(torch_job(src, [0], env={"FAIL_RANK": "2"}), tmp_path, timeout_s=120, stop_grace_s=GRACE_S)
    ended = max(r.ended_at for r in results) - t0
    assert ended < 30, f"the job took {ended:.1f} s to end after a process failed"
    for r in results:
        assert r.exit_code == 1, (r.host, r.exit_code, r.failure)
