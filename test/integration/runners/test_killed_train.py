"""`train` killed with SIGKILL where no kernel ends the rest for it (a bare host, no PID namespace of its own).

In a container the kernel ends everything with the first process; here `train` is an ordinary
process of this machine (or of a local host whose init lives on), and its tripwires must end
what it started: the script and what the script started, mpirun and its ranks, sshd, and the
job's ssh keys.
"""

from __future__ import annotations

import glob
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.jobrecord import STAMP_S, record_at, wall
from helpers.jobs import clean_env, train_cmd, write_job
from helpers.multihost import hps
from helpers.procenv import environ_value
from training_toolkit.supervise import procfs
from training_toolkit.local.launcher import LocalJob, run_local

#: Seconds after the SIGKILL by which every process train started must be gone.
BOUND_S = 5


def pidfds(root: int) -> dict[int, int]:
    """Everything below ``root`` now, held by pidfds."""
    held = {}
    for proc in procfs.descendants(root):
        try:
            held[proc.pid] = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            pass
    return held


def wait_all_gone(held: dict[int, int], what: str) -> float:
    began = time.monotonic()
    try:
        while left := [procfs.describe(p) for p, fd in held.items() if not select.select([fd], [], [], 0)[0]]:
            assert time.monotonic() - began < BOUND_S, f"{what}: alive {BOUND_S} s after train was killed: {left}"
            time.sleep(0.02)
    finally:
        for fd in held.values():
            os.close(fd)
    return time.monotonic() - began


def wait_for_files(paths: list[Path], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never written: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def test_the_script_and_what_it_started_die_with_train(tmp_path):
    job = tmp_path / "job"
    write_job(job, script=(
        "import os, subprocess, time\n"
        "subprocess.Popen(['sleep', '300'])\n"
        "subprocess.Popen(['sh', '-c', 'sleep 301 & while :; do :; done'], start_new_session=True)\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'started'), 'w').close()\n"
        "time.sleep(300)\n"))
    (job / "model").mkdir()
    train = subprocess.Popen(train_cmd() + ["--base-dir", str(job)], env=clean_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    held: dict[int, int] = {}
    try:
        wait_for_files([job / "model" / "started"])
        deadline = time.monotonic() + 30  # the script, both sleeps and the loop: the last may still be forking
        while not any(procfs.cmdline(p.pid) == "sleep 301" for p in procfs.descendants(train.pid)):
            assert time.monotonic() < deadline, "the script's children never started"
            time.sleep(0.02)
        held = pidfds(train.pid)
        train.kill()
        train.wait()
        print(f"\nlast process gone {wait_all_gone(held, 'single'):.3f} s after train")
    finally:
        _kill_tree(train)  # a failed assertion above must not leave the job for the next tests


def test_a_child_that_cleared_its_environment_dies_with_train_and_an_unrelated_process_naming_the_job_does_not(tmp_path):
    """The script's own tree is held by its deadman (supervise/deadman.py), token or not; a process is never
    matched by its command line, so one that merely names the job's directory is left alone."""
    job = tmp_path / "job"
    write_job(job, script=(
        "import os, subprocess, time\n"
        "subprocess.Popen(['env', '-i', '/bin/sleep', '302'])\n"  # no token: still the script's child
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'started'), 'w').close()\n"
        "time.sleep(300)\n"))
    (job / "model").mkdir()
    unrelated = subprocess.Popen(["sh", "-c", "sleep 305; :", str(job)], start_new_session=True)
    train = subprocess.Popen(train_cmd() + ["--base-dir", str(job)], env=clean_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_for_files([job / "model" / "started"])
        deadline = time.monotonic() + 30
        while not any(procfs.cmdline(p.pid) == "/bin/sleep 302" for p in procfs.descendants(train.pid)):
            assert time.monotonic() < deadline, "the script's child never started"
            time.sleep(0.02)
        assert environ_value(unrelated.pid, "TRAINING_TOOLKIT_SUPERVISOR") is None
        held = pidfds(train.pid)
        train.kill()
        train.wait()
        print(f"\nlast process gone {wait_all_gone(held, 'cleared'):.3f} s after train")
        assert unrelated.poll() is None and str(job) in (procfs.cmdline(unrelated.pid) or "")
    finally:
        _kill_tree(train)
        os.killpg(unrelated.pid, signal.SIGKILL)
        unrelated.wait()


def _kill_tree(proc: subprocess.Popen) -> None:
    for child in procfs.descendants(proc.pid):
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait()


@pytest.mark.root
@pytest.mark.mpi
@pytest.mark.sshd
@pytest.mark.parametrize("victim, expected", [("algo-1", "mpirun"), ("algo-2", "sshd")])
def test_a_killed_train_ends_mpi_and_sshd_removes_its_keys_and_the_job_fails_naming_it(tmp_path, victim, expected):
    src = tmp_path / "src"
    src.mkdir()
    (src / "spin.py").write_text(
        "import os, time\nfrom mpi4py import MPI\nrank = MPI.COMM_WORLD.Get_rank()\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], f'started-{rank}'), 'w').close()\n"
        "while True:\n    MPI.COMM_WORLD.allreduce(rank)\n    time.sleep(0.1)\n")
    job = LocalJob(hosts=("algo-1", "algo-2"), env={"TRAINING_TOOLKIT_PEER_TIMEOUT": "3"},
                   hyperparameters=hps("spin.py", src, sagemaker_mpi_enabled=True,
                                       sagemaker_mpi_num_of_processes_per_host=1))
    seen: dict[str, object] = {}

    def kill_train(procs):
        work = tmp_path / "cluster"
        wait_for_files([work / h / "opt/ml/model" / f"started-{r}" for h, r in (("algo-1", 0), ("algo-2", 1))])
        train = procs[victim]
        seen["ssh_dirs"] = ssh_dirs(train.command_pid, seen["init"])
        seen["rank_dirs"] = glob.glob(f"/proc/{seen['init']}/root/run/training-toolkit-ranks-*")  # the ranks' file
        seen["watch_dirs"] = glob.glob(f"/proc/{seen['init']}/root/run/training-toolkit-watch-*")  # heartbeats
        held = pidfds(train.command_pid)
        seen["names"] = [procfs.comm(p) for p in held]
        train.send_signal(signal.SIGKILL)  # train alone: the host's init lives on, as on a bare host
        seen["killed"] = time.monotonic()
        # while the cluster runs on: what ends now is ended by the tripwires, not by the cluster's teardown
        seen["gone_s"] = wait_all_gone(held, victim)
        seen["dirs_left"] = [d for d in [*seen["ssh_dirs"], *seen["rank_dirs"], *seen["watch_dirs"]] if Path(d).exists()]

    results = run_local(job, tmp_path / "cluster", environ=os.environ, timeout_s=120, out=sys.stdout.buffer, on_start=kill_train,
                        before_start=lambda cluster: seen.update(init=cluster.host(victim).pid))
    assert expected in seen["names"], seen["names"]  # type: ignore[operator]
    print(f"\n{victim}'s last process gone {seen['gone_s']:.3f} s after its train")
    assert seen["ssh_dirs"] and len(seen["rank_dirs"]) == 1 and len(seen["watch_dirs"]) == 1 and seen["dirs_left"] == []
    (other,) = [r for r in results if r.host != victim]
    assert other.exit_code not in (0, None) and victim in (other.failure or ""), (other.exit_code, other.failure)
    assert other.ended_at is not None and other.ended_at - seen["killed"] < 30  # type: ignore[operator]
    # the killed train's record stands up to its kill: its seat, the attempt, its start, its ranks' first progress if
    # they made any by then; no verdict
    (killed,) = [r for r in results if r.host == victim]
    entries = record_at(killed.opt_ml, victim)
    assert [item["kind"] for item in entries if item["kind"] != "progress"] == ["job", "attempt", "started"], entries
    assert entries[-1]["t"] < wall(seen["killed"]) + STAMP_S  # type: ignore[arg-type]


def ssh_dirs(train: int, init: int) -> list[str]:
    """The job's ssh directories on this host, named by processes below ``train`` (sshd's ``-f``, ssh's
    ``-F``; orted's command line also names the first host's), reached through the host's init."""
    found = set()
    for proc in procfs.descendants(train):
        for arg in (procfs.cmdline(proc.pid) or "").split():
            if arg.endswith(("/sshd_config", "/ssh_config")):
                found.add(f"/proc/{init}/root{os.path.dirname(arg)}")
    return sorted(d for d in found if Path(d).is_dir())
