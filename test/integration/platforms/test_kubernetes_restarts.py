"""Kubernetes restarts on the simulated operators: a container restarted in its pod, a pod lost, a JobSet restart.

Each pod is a local namespace host given what its operator gives it (helpers/kubernetes.py); the
kubelet's restarts are helpers/kubelet.py: the container of a pod starts again in place (same
hostname, address and /opt/ml), after the kubelet's back-off, as its restartPolicy says.  The
toolkit's real ``train`` runs in every pod; nothing here is a real cluster.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from helpers import kubernetes as k8s
from helpers.deadhost import wait_for
from helpers.kubelet import Kubelet
from helpers.multihost import hps, rank_files, source_dir

pytestmark = [pytest.mark.root]
WORKER = "ptj-worker-0"
BASE = {"TRAINING_TOOLKIT_DNS_TIMEOUT": "30", "TRAINING_TOOLKIT_MAX_RESTARTS": "1", "STEPS": "14"}


def log(tmp_path, pod: str) -> str:
    return k8s.termination_log(tmp_path / "cluster", pod)


def verdict(tmp_path, pod: str) -> str:
    return k8s.termination_verdict(tmp_path / "cluster", pod)


def kill_train_mid_job(tmp_path, pod: str, seen: dict, victim: str | None = None):
    """An ``on_start`` that SIGKILLs ``victim``'s train (its container's first process; default ``pod``'s) once
    ``pod``'s rank is at step 2."""
    progress = tmp_path / "cluster" / pod / "opt/ml/model/progress-1"
    victim = victim or pod

    def kill(procs):
        if victim not in procs or "killed" in seen:
            return  # a restarted container's train: left alone
        wait_for(progress, timeout_s=120, at_least=2)  # read once per look: the rank rewrites the file as it goes
        procs[victim].send_signal(signal.SIGKILL)
        seen["killed"] = time.monotonic()

    return kill


@pytest.mark.torch
def test_a_worker_pods_container_restarted_in_place_rejoins_and_the_job_resumes(tmp_path):
    src = source_dir(tmp_path, "torch_resume.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=1, nproc=1)  # restartPolicy OnFailure: the operator's default
    kubelet = Kubelet("OnFailure", backoff_limit=3)
    seen: dict = {}
    results = k8s.run(pods, tmp_path, hps("torch_resume.py", src), env={**BASE, "TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"},
                      timeout_s=240, on_start=kill_train_mid_job(tmp_path, WORKER, seen), kubelet=kubelet)
    assert [r.exit_code for r in results] == [0, 0], [(r.exit_code, r.failure) for r in results]
    assert kubelet.restarts == {WORKER: 1} and kubelet.ended[0] == (WORKER, -signal.SIGKILL)
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1]
    assert all(info["attempt"] == 1 and info["start"] >= 2 for info in ranks.values()), ranks  # resumed
    assert len({info["start"] for info in ranks.values()}) == 1
    assert verdict(tmp_path, "ptj-master-0") == "training completed (exit code 0)\n"
    assert verdict(tmp_path, WORKER) == "container restart 1: training completed (exit code 0)\n"
    runs = (results[1].opt_ml / ".training-toolkit-runs").read_text().splitlines()
    assert len(runs) == 2  # the emptyDir kept the first run's record


@pytest.mark.torch
def test_a_worker_pod_that_never_comes_back_ends_the_job_naming_it_within_the_join_deadline(tmp_path):
    src = source_dir(tmp_path, "torch_resume.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=1, nproc=1)
    # its node is lost: its container never starts again; the first host's own failure then reaches backoffLimit 1
    kubelet = Kubelet("OnFailure", backoff_limit=1, gone={WORKER})
    seen: dict = {}
    join_s, grace_s = 20, 10  # the local launcher's grace: TRAINING_TOOLKIT_GRACE_PERIOD
    results = k8s.run(pods, tmp_path, hps("torch_resume.py", src),
                      env={**BASE, "TRAINING_TOOLKIT_JOIN_TIMEOUT": str(join_s), "STEPS": "200"},
                      timeout_s=240, on_start=kill_train_mid_job(tmp_path, WORKER, seen), kubelet=kubelet)
    master, worker = results
    assert worker.exit_code == -signal.SIGKILL and kubelet.restarts == {}
    assert master.exit_code == 69, (master.exit_code, master.failure)
    assert master.ended_at - seen["killed"] < join_s + grace_s + 20  # the restart's barrier: join deadline + grace
    expected = (f"hosts not ready within {join_s + grace_s} s (left the job and did not join again: {WORKER})")
    assert expected in master.failure and expected in log(tmp_path, "ptj-master-0")
    # attempt 1's cause: the worker's loss, or rank 0's gloo error it caused, whichever was seen first (ms apart)
    assert re.search(rf"earlier: attempt 1: ({WORKER}: left the job|ptj-master-0 rank 0: )", master.failure), master.failure


@pytest.mark.torch
def test_a_jobset_restart_starts_the_job_at_its_restart_attempt_with_its_own_restarts_left(tmp_path):
    """JobSet recreates every pod with restart-attempt 1 (fresh pods, fresh emptyDirs): the job starts at attempt 1.

    TRAINING_TOOLKIT_MAX_RESTARTS counts the job's own restarts from there: a rank that fails in
    attempt 1 restarts every rank at attempt 2.
    """
    src = source_dir(tmp_path, "torch_resume.py")
    pods = k8s.jobset("js", "ns1", [("workers", 1, 2)], attempt=1)
    results = k8s.run(pods, tmp_path, hps("torch_resume.py", src, sagemaker_torch_distributed_enabled=True,
                                          sagemaker_distributed_processes_per_host=1),
                      env={**BASE, "TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "FAIL": "1:1:2", "STEPS": "5"},
                      timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [(r.exit_code, r.failure) for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1]
    assert all(info["attempt"] == 2 and info["start"] == 2 for info in ranks.values()), ranks
    runs = (results[0].opt_ml / ".training-toolkit-runs").read_text().splitlines()
    assert len(runs) == 1 and runs[0].endswith("attempt=1")
    assert all(verdict(tmp_path, p.name) == "training completed (exit code 0)\n" for p in pods)


@pytest.mark.torch
def test_a_first_host_restarted_in_place_ends_the_job_named_and_the_restarted_pods_start_it_over(tmp_path, capfd):
    """The others cannot rejoin a first host that lost the job's state: each ends at once, naming it.

    With restartPolicy OnFailure the kubelet restarts every container that failed, so the pods
    form the job again from attempt 0, and the script resumes from its checkpoint (the first
    host's emptyDir kept it).
    """
    master = "ptj-master-0"
    src = source_dir(tmp_path, "torch_resume.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=1, nproc=1)
    kubelet = Kubelet("OnFailure", backoff_limit=3)
    seen: dict = {}
    on_start = kill_train_mid_job(tmp_path, WORKER, seen, victim=master)
    results = k8s.run(pods, tmp_path, hps("torch_resume.py", src), env={**BASE, "TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"},
                      timeout_s=240, on_start=on_start, kubelet=kubelet)
    assert [r.exit_code for r in results] == [0, 0], [(r.exit_code, r.failure) for r in results]
    assert kubelet.ended[:2] == [(master, -signal.SIGKILL), (WORKER, 69)] and kubelet.restarts == {master: 1, WORKER: 1}
    assert kubelet.ended_at[1] - seen["killed"] < 10 + 5  # at once (the link closed); at worst the peer timeout
    out = capfd.readouterr().out
    assert f"[{WORKER}] training-toolkit: failed: {WORKER}: lost the lead {master}" in out, out[-3000:]
    ranks = rank_files(results)
    assert all(info["attempt"] == 0 and info["start"] >= 2 for info in ranks.values()), ranks  # started over, resumed
    assert all(verdict(tmp_path, p.name) == "container restart 1: training completed (exit code 0)\n" for p in pods)


MPI_RESUME = """import json, os, time
from pathlib import Path
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
out = Path(os.environ["SM_MODEL_DIR"])
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
checkpoint = out / "checkpoint"
start = comm.bcast(int(checkpoint.read_text()) + 1 if rank == 0 and checkpoint.exists() else 0, root=0)
for step in range(start, int(os.environ["STEPS"])):
    total = comm.allreduce(step)
    if rank == 0:
        checkpoint.write_text(str(step))
    (out / f"progress-{rank}").write_text(str(step))
    time.sleep(0.3)
(out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "attempt": attempt, "start": start}))
"""


@pytest.mark.mpi
@pytest.mark.sshd
def test_an_mpijob_workers_container_restarted_in_place_rejoins_with_its_new_ssh_host_key(tmp_path):
    """The restarted worker makes a new sshd host key; the launcher pins it at the restart's barrier."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "resume.py").write_text(MPI_RESUME)
    pods = k8s.mpijob("mpj", "ns1", workers=1, slots=1)
    worker = "mpj-worker-0"
    kubelet = Kubelet("OnFailure", backoff_limit=3)
    seen: dict = {}
    results = k8s.run(pods, tmp_path, hps("resume.py", src), env={**BASE, "TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"},
                      timeout_s=240, on_start=kill_train_mid_job(tmp_path, worker, seen), kubelet=kubelet)
    assert [r.exit_code for r in results] == [0, 0], [(r.exit_code, r.failure) for r in results]
    assert kubelet.restarts == {worker: 1}
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1]
    assert all(info["attempt"] == 1 and info["start"] >= 2 for info in ranks.values()), ranks
    assert verdict(tmp_path, worker) == "container restart 1: training completed (exit code 0)\n"
