"""The MPI runner on real local clusters: sshd per host, mpirun, mpi4py, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.multihost import hps, rank_files, run, source_dir
from training_toolkit.local.launcher import LocalJob, run_local

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

HOSTS3 = ("algo-1", "algo-2", "algo-3")
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30"}


def mpi_job(src: Path, hosts=HOSTS3, per_host=2, env=None, **extra) -> LocalJob:
    return LocalJob(hosts=hosts, hyperparameters=hps("mpi_allreduce.py", src, sagemaker_mpi_enabled=True,
                                                     sagemaker_mpi_num_of_processes_per_host=per_host, **extra),
                    env={**FAST, **(env or {})})


def test_mpi4py_allreduce_on_3_hosts_x_2(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    results = run(mpi_job(src, msg="a b; 'c' \"d\" $(id)"), tmp_path)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    assert all(r.success for r in results)
    ranks = rank_files(results)
    for info in ranks.values():
        assert info["sm_current_host"] == info["host"] == info["hostname"] == info["training_env_host"]
    assert sorted(ranks) == list(range(6))
    assert {info["sum"] for info in ranks.values()} == {21}
    assert all(info["argv"] == ["--msg", "a b; 'c' \"d\" $(id)"] for info in ranks.values())
    assert [ranks[i]["hostname"] for i in range(6)] == ["algo-1", "algo-1", "algo-2", "algo-2", "algo-3", "algo-3"]
    ended = [r.ended_at for r in results]
    assert max(ended) - min(ended) < 1.0, f"hosts ended {max(ended) - min(ended):.2f} s apart"


#: a rank that leaves a daemon running as it ends: in a session of its own, deaf to SIGTERM, holding the rank's output
LEAVES_A_DAEMON = """
import subprocess
subprocess.Popen(["bash", "-c", "trap '' TERM; setsid bash -c \\"trap '' TERM; exec sleep 4321\\" & exec sleep 4321"])
print("rank done", flush=True)
"""


def test_what_a_rank_leaves_running_is_ended_with_it_so_the_job_ends(tmp_path):
    """Open MPI waits for a rank's output to close as well as for its end: a daemon the rank left holding its output
    kept every host's job running forever.  The rank's parent (native/rank_exec.c) is the rank's subreaper and ends
    what it left (SIGTERM, a second, SIGKILL), so the job ends with its success, nothing left (``run`` checks)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "leaves.py").write_text(LEAVES_A_DAEMON)
    job = LocalJob(hosts=HOSTS3, hyperparameters=hps("leaves.py", src, sagemaker_mpi_enabled=True,
                                                     sagemaker_mpi_num_of_processes_per_host=1), env=FAST)
    t0 = time.monotonic()
    results = run(job, tmp_path, timeout_s=90)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    assert time.monotonic() - t0 < 60, "the job waited for the daemons its ranks left"


def test_a_rank_raising_fails_every_host_with_the_cause(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    results = run(mpi_job(src, env={"FAIL_RANK": "3"}), tmp_path)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    for r in results:
        assert not r.success
        first = r.failure.splitlines()[0]
        assert "rank 3" in first and "algo-2" in first, first
        assert "ValueError: rank 3 was told to fail" in first, first


def spread(results) -> float:
    ended = [r.ended_at for r in results]
    return max(ended) - min(ended)


def test_a_rank_killed_by_sigkill_on_the_last_host(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    t0 = time.monotonic()
    results = run(mpi_job(src, env={"KILL_RANK": "5"}), tmp_path)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    for r in results:
        first = r.failure.splitlines()[0]
        assert "rank 5 on algo-3 killed by SIGKILL" in first, first
    assert spread(results) < 3.0
    assert time.monotonic() - t0 < 30


def test_a_host_whose_sshd_never_starts(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    job = mpi_job(src)
    job = LocalJob(**{**job.__dict__, "host_env": {"algo-3": {"TRAINING_TOOLKIT_SSHD": "/bin/false"}}})
    t0 = time.monotonic()
    results = run(job, tmp_path)
    assert time.monotonic() - t0 < 20
    for r in results:
        assert r.exit_code not in (0, None)
        first = r.failure.splitlines()[0]
        assert first.startswith("algo-3: sshd rejected"), first
        assert r.exit_code == 69
    assert spread(results) < 3.0


def test_a_host_that_never_starts_train(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    job = mpi_job(src, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "4"})
    job = LocalJob(**{**job.__dict__, "start_hosts": ["algo-1", "algo-2"]})
    t0 = time.monotonic()
    results = run(job, tmp_path)
    assert time.monotonic() - t0 < 15
    by_host = {r.host: r for r in results}
    assert by_host["algo-3"].exit_code is None
    for name in ("algo-1", "algo-2"):
        assert by_host[name].exit_code == 69
        assert "never joined: algo-3" in by_host[name].failure.splitlines()[0]


def signal_later(host: str, signum: int, delay_s: float = 3.0):
    """An on_start hook: send ``signum`` to ``host``'s train after ``delay_s``."""
    def on_start(procs):
        threading.Timer(delay_s, lambda: procs[host].send_signal(signum)).start()
    return on_start


def test_sigterm_to_the_first_hosts_train_stops_the_job_everywhere(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    t0 = time.monotonic()
    results = run(mpi_job(src, env={"SLEEP": "60"}), tmp_path, on_start=signal_later("algo-1", signal.SIGTERM))
    assert time.monotonic() - t0 < 20
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    assert all(not r.success and r.failure for r in results)
    assert spread(results) < 3.0


def test_a_worker_host_vanishing_fails_the_job(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    t0 = time.monotonic()
    results = run_local_no_survivor_check(mpi_job(src, env={"SLEEP": "60"}), tmp_path,
                                          on_start=signal_later("algo-2", signal.SIGKILL))
    assert time.monotonic() - t0 < 20
    by_host = {r.host: r for r in results}
    for name in ("algo-1", "algo-3"):
        assert by_host[name].exit_code not in (0, None)
        assert "algo-2" in by_host[name].failure.splitlines()[0], by_host[name].failure
        assert not by_host[name].survivors


def run_local_no_survivor_check(job, tmp_path, **kw):
    """A SIGKILLed train cannot clean up its own host (callers check the others themselves)."""
    return run_local(job, tmp_path / "cluster", environ=os.environ, timeout_s=120, out=sys.stdout.buffer, **kw)


def squat(host: str, port: int):
    """A before_start hook: another process listens on ``port`` in ``host`` before train starts."""
    def before_start(cluster):
        code = f"import socket,time; s=socket.socket(); s.bind(('',{port})); s.listen(); print('up', flush=True); time.sleep(120)"
        proc = cluster.popen(host, [sys.executable, "-c", code], stdout=subprocess.PIPE)
        proc.stdout.readline()
    return before_start


def test_control_port_taken_on_the_first_host(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    t0 = time.monotonic()
    results = run_local_no_survivor_check(mpi_job(src, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "5"}), tmp_path,
                                          before_start=squat("algo-1", 8950))
    assert time.monotonic() - t0 < 20
    by_host = {r.host: r for r in results}
    first = by_host["algo-1"].failure.splitlines()[0]
    assert by_host["algo-1"].exit_code == 69 and "port 8950" in first and "in use" in first, first
    for name in ("algo-2", "algo-3"):
        assert by_host[name].exit_code == 69
        assert "control channel on algo-1:8950" in by_host[name].failure, by_host[name].failure


def test_preemption_gives_every_rank_its_grace_period_to_checkpoint(tmp_path):
    """The platform stops every container (SIGTERM to each train): ranks get SIGTERM and time to save."""
    src = source_dir(tmp_path, "mpi_allreduce.py")

    def stop_all_when_ranks_wait(procs):
        def later():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if len(list((tmp_path / "cluster").glob("algo-*/opt/ml/model/waiting-*"))) == 6:
                    break
                time.sleep(0.05)
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
        threading.Thread(target=later, daemon=True).start()

    results = run(mpi_job(src, env={"SLEEP": "60", "CHECKPOINT_ON_TERM": "1"}), tmp_path,
                  on_start=stop_all_when_ranks_wait)
    saved = sorted(p.name for r in results for p in r.model_dir.glob("checkpoint-*"))
    assert saved == [f"checkpoint-{i}" for i in range(6)]
    for r in results:
        assert r.exit_code == 143, (r.host, r.exit_code, r.failure)
        assert "stopped by SIGTERM" in r.failure.splitlines()[0]
    assert spread(results) < 3.0


def test_ssh_port_taken_on_a_worker(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    t0 = time.monotonic()
    results = run_local_no_survivor_check(mpi_job(src), tmp_path, before_start=squat("algo-2", 22))
    assert time.monotonic() - t0 < 20
    for r in results:
        assert r.exit_code == 69, (r.host, r.exit_code)
        first = r.failure.splitlines()[0]
        assert "algo-2" in first and "sshd could not listen on port 22" in first, first
    assert spread(results) < 3.0


def test_code_that_fails_on_one_host_fails_the_job_at_once(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    # SAGEMAKER_PROGRAM wins over the hyperparameter (as in the reference): only algo-2 looks for this
    job = mpi_job(src)
    job = LocalJob(**{**job.__dict__, "host_env": {"algo-2": {"SAGEMAKER_PROGRAM": "missing.py"}}})
    t0 = time.monotonic()
    results = run(job, tmp_path)
    assert time.monotonic() - t0 < 15
    for r in results:
        assert r.exit_code == 66, (r.host, r.exit_code, r.failure)
        first = r.failure.splitlines()[0]
        assert first.startswith("algo-2: entry point 'missing.py' not found"), first


def test_a_host_cut_off_from_the_network_is_found_by_its_silence(tmp_path):
    """No FIN, no RST: the host just goes quiet. Heartbeats find it; every host ends non-zero."""
    src = source_dir(tmp_path, "mpi_allreduce.py")
    clusters = []

    def cut_algo_3_when_running(procs):
        def later():
            deadline = time.monotonic() + 30
            while len(list((tmp_path / "cluster").glob("algo-*/opt/ml/model/waiting-*"))) < 6:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            clusters[0].run("algo-3", ["ip", "link", "set", "eth0", "down"], timeout=10, check=True)
        threading.Thread(target=later, daemon=True).start()

    env = {"SLEEP": "60", "CHECKPOINT_ON_TERM": "1", "TRAINING_TOOLKIT_PEER_TIMEOUT": "3"}
    t0 = time.monotonic()
    results = run_local_no_survivor_check(mpi_job(src, env=env), tmp_path, before_start=clusters.append,
                                          on_start=cut_algo_3_when_running)
    assert time.monotonic() - t0 < 30
    by_host = {r.host: r for r in results}
    for name in ("algo-1", "algo-2"):
        assert by_host[name].exit_code == 69, (name, by_host[name].exit_code, by_host[name].failure)
        assert by_host[name].failure.splitlines()[0] == "algo-3: left the job (timed out)"
        assert not by_host[name].survivors
    assert by_host["algo-3"].exit_code == 69
    assert "lost the lead algo-1" in by_host["algo-3"].failure
    assert not by_host["algo-3"].survivors, "the cut-off host must still end its own ranks"
