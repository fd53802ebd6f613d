"""Stalls and restarts end to end: real train on local hosts, real mpirun, torch gloo, real signals.

Timed assertions are generous: the machine runs other tests at the same time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.jobs import clean_env, train_cmd, write_job
from helpers.jobrecord import STAMP_S, cost_at, metrics, of_kind, record_at, summary_lines
from helpers.recorder import Recorder
from helpers.multihost import hps, rank_files, run, source_dir
from helpers.paths import REPO
from training_toolkit.core.errors import EXIT_STALLED
from training_toolkit.local.launcher import LocalJob, default_train

H2 = ("algo-1", "algo-2")
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30"}
NO_PTRACE = [sys.executable, str(REPO / "test" / "helpers" / "noptrace.py")]


def mpi_job(src: Path, env: dict, hosts=H2, **kw) -> LocalJob:
    return LocalJob(hosts=hosts, env={**FAST, **env}, **kw,
                    hyperparameters=hps("mpi_stall.py", src, sagemaker_mpi_enabled=True,
                                        sagemaker_mpi_num_of_processes_per_host=2))


def last_output_time(lines: list[tuple[float, bytes]]) -> float:
    return max(t for t, line in lines if b"<stdout>:attempt " in line)  # rank 0's steps, tagged by mpirun


@pytest.mark.root
@pytest.mark.mpi
@pytest.mark.sshd
def test_a_hung_rank_ends_the_job_with_every_ranks_stack_without_ptrace(tmp_path):
    """The issue's job: 2 hosts x 2 ranks, rank 3 sleeps at step 3, the others wait in allreduce.

    ptrace is denied to everything the hosts run (a seccomp filter, as a default container's) and
    py-spy is off: the stacks come from the faulthandler hook alone.
    """
    from training_toolkit.local.launcher import run_local

    src = source_dir(tmp_path, "mpi_stall.py")
    env = {"TRAINING_TOOLKIT_STALL_TIMEOUT": "10", "TRAINING_TOOLKIT_PY_SPY": "none", "STALL_RANK": "3"}
    out = Recorder(echo=True)
    results = run_local(mpi_job(src, env, train=[*NO_PTRACE, *default_train()]), tmp_path / "cluster",
                        environ=os.environ, timeout_s=120, out=out)
    last = last_output_time(out.lines)
    for r in results:
        assert r.exit_code == EXIT_STALLED and not r.survivors, (r.host, r.exit_code, r.survivors)
        assert r.ended_at - last < 10 + 5, f"{r.host} ended {r.ended_at - last:.1f} s after the last output"
        first = r.failure.splitlines()[0]
        assert "the job stalled: no output line or heartbeat from any rank for 10 s" in first, first
        assert re.search(r"stacks: rank 3 on algo-2: time\.sleep\(3600\) at mpi_stall\.py:\d+; "
                         r"ranks 0-2 on algo-1, algo-2: total = comm\.allreduce\(step, op=MPI\.SUM\) at mpi_stall\.py:\d+",
                         first), first
    details = results[0].failure
    assert "rank 3 on algo-2 (faulthandler):" in details and "ranks 0-2 on algo-1, algo-2 (faulthandler):" in details
    assert "  hang at mpi_stall.py:" in details and "runpy" not in details


@pytest.mark.py_spy
def test_a_rank_without_the_hook_is_read_by_py_spy_and_never_killed_by_the_hooks_signal(tmp_path):
    """The script re-execs itself isolated (``python -I``): its stack file is there, its handler is not."""
    base = tmp_path / "opt_ml"
    write_job(base, script=(
        "import os, sys, time\n"
        "if sys.flags.isolated == 0:\n"
        "    os.execv(sys.executable, [sys.executable, '-I', os.path.abspath(__file__)])\n"
        "print('up', flush=True)\n"
        "def wait_forever():\n"
        "    time.sleep(3600)\n"
        "wait_forever()\n"))
    env = clean_env(TRAINING_TOOLKIT_STALL_TIMEOUT="3", TRAINING_TOOLKIT_STALL_STARTUP="3")
    t0 = time.monotonic()
    done = subprocess.run(train_cmd() + ["--base-dir", str(base)], capture_output=True, timeout=60, env=env)
    assert done.returncode == EXIT_STALLED, done.stderr.decode()
    assert time.monotonic() - t0 < 20
    failure = (base / "output" / "failure").read_text()
    assert re.search(r"stacks: script on algo-1: time\.sleep\(3600\) at train\.py:6", failure), failure
    assert "script on algo-1 (py-spy):" in failure


def test_a_single_host_restart_resumes_and_the_script_sees_its_attempt(tmp_path):
    base = tmp_path / "opt_ml"
    write_job(base, script=(
        "import os, pathlib, sys\n"
        "model = pathlib.Path(os.environ['SM_MODEL_DIR'])\n"
        "attempt = os.environ['TRAINING_TOOLKIT_RESTART_COUNT']\n"
        "(model / f'attempt-{attempt}').write_text(os.environ.get('TORCHELASTIC_RESTART_COUNT', 'unset'))\n"
        "sys.exit(3 if attempt == '0' else 0)\n"))
    (base / "model").mkdir()
    env = clean_env(TRAINING_TOOLKIT_MAX_RESTARTS="1")
    done = subprocess.run(train_cmd() + ["--base-dir", str(base)], capture_output=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(p.name for p in (base / "model").iterdir()) == ["attempt-0", "attempt-1"]
    assert (base / "model" / "attempt-1").read_text() == "unset"  # torch's name is for torch's runner
    assert b"algo-1: attempt 2 of 2 starting (train.py exited with code 3)" in done.stderr
    assert (base / "output" / "success").exists()
    # the job's record: the failure, the restart, both attempts, the verdict; its cost; one summary line
    entries = record_at(base, "algo-1")
    assert [item["kind"] for item in entries] == ["job", "attempt", "started", "fault", "restart", "attempt",
                                                  "started", "verdict"], entries
    (failed,) = of_kind(entries, "fault")
    assert (failed["attempt"], failed["fault"], failed["reason"]) == (0, "failure", "train.py exited with code 3")
    assert of_kind(entries, "restart")[0]["attempt"] == 1 and of_kind(entries, "verdict")[0]["exit_code"] == 0
    cost = cost_at(base, "algo-1")
    assert cost["basis"] == "started" and [f["next_attempt"] for f in cost["faults"]] == [1]
    assert 0 <= cost["faults"][0]["lost_s"] <= cost["wall_s"] < 60
    (line,) = summary_lines(done.stderr.decode())
    assert metrics(line)["toolkit:attempts"] == "2" and metrics(line)["toolkit:faults"] == "1", line
    assert 0 < float(metrics(line)["toolkit:running_fraction"]) <= 1, line


def test_a_scripts_checkpoint_mark_makes_the_cost_count_the_work_lost_and_a_goodput(tmp_path):
    base = tmp_path / "opt_ml"
    write_job(base, script=(
        "import os, pathlib, sys, time\n"
        "model, attempt = pathlib.Path(os.environ['SM_MODEL_DIR']), os.environ['TRAINING_TOOLKIT_RESTART_COUNT']\n"
        "time.sleep(1.0)\n"
        "pathlib.Path(os.environ['TRAINING_TOOLKIT_HEARTBEAT_DIR'], 'checkpoint').touch()  # the documented line\n"
        "(model / f'mark-{attempt}').write_text(repr(time.time()))\n"
        "time.sleep(1.5)  # work after the checkpoint: lost when this attempt fails\n"
        "(model / f'end-{attempt}').write_text(repr(time.time()))\n"
        "sys.exit(3 if attempt == '0' else 0)\n"))
    (base / "model").mkdir()
    env = clean_env(TRAINING_TOOLKIT_MAX_RESTARTS="1", TRAINING_TOOLKIT_STALL_TIMEOUT="60")  # heartbeats: watched only
    done = subprocess.run(train_cmd() + ["--base-dir", str(base)], capture_output=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr.decode()
    entries = record_at(base, "algo-1")
    assert [item["attempt"] for item in of_kind(entries, "checkpoint")] == [0, 1], entries
    assert [item["attempt"] for item in of_kind(entries, "progress")] == [0, 1], entries
    cost = cost_at(base, "algo-1")
    assert cost["basis"] == "progress" and cost["lost_work_included"] is True and cost["checkpoints"] == 2
    (fault,) = cost["faults"]
    since_mark = float((base / "model" / "end-0").read_text()) - float((base / "model" / "mark-0").read_text())
    # the mark is seen within the watch's interval (0.5 s) after it: the loss counts from then
    assert since_mark - 0.7 <= fault["lost_work_s"] <= since_mark + 0.2, (fault, since_mark)
    assert 0 < cost["goodput"] < cost["running_fraction"] <= 1, cost
    (line,) = summary_lines(done.stderr.decode())
    assert float(metrics(line)["toolkit:goodput"]) == cost["goodput"], line
    assert "s of work since the last checkpoint" in line, line


def test_without_restarts_left_the_verdict_lists_every_attempts_cause(tmp_path):
    base = tmp_path / "opt_ml"
    write_job(base, script="import os, sys\nsys.exit(3 + int(os.environ['TRAINING_TOOLKIT_RESTART_COUNT']))\n")
    env = clean_env(TRAINING_TOOLKIT_MAX_RESTARTS="2")
    done = subprocess.run(train_cmd() + ["--base-dir", str(base)], capture_output=True, timeout=60, env=env)
    assert done.returncode == 5
    first = (base / "output" / "failure").read_text().splitlines()[0]
    assert first == ("train.py exited with code 5 (attempt 3 of 3; earlier: attempt 1: train.py exited with code 3; "
                     "attempt 2: train.py exited with code 4)")


def test_sigterm_is_a_stop_never_a_restart(tmp_path):
    base = tmp_path / "opt_ml"
    started = tmp_path / "started"
    write_job(base, script=f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\n")
    proc = subprocess.Popen(train_cmd() + ["--base-dir", str(base)], stderr=subprocess.PIPE,
                            env=clean_env(TRAINING_TOOLKIT_MAX_RESTARTS="3"))
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    signalled = time.time()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    stderr = proc.stderr.read().decode()
    assert "attempt 2" not in stderr
    stop = of_kind(record_at(base, "algo-1"), "fault")[0]  # the stop, when train saw it (then the script's end)
    assert (stop["fault"], stop["reason"]) == ("stop", "SIGTERM on algo-1") and signalled - STAMP_S <= stop["t"] < signalled + 5
    assert of_kind(record_at(base, "algo-1"), "verdict")[0]["exit_code"] == 143
    (line,) = summary_lines(stderr)
    assert metrics(line)["toolkit:faults"] == "1", line


@pytest.mark.root
@pytest.mark.mpi
@pytest.mark.sshd
def test_mpi_a_hang_then_a_stall_restart_resumes_from_the_checkpoint(tmp_path):
    src = source_dir(tmp_path, "mpi_stall.py")
    env = {"TRAINING_TOOLKIT_STALL_TIMEOUT": "4", "TRAINING_TOOLKIT_STALL_STARTUP": "30",
           "TRAINING_TOOLKIT_MAX_RESTARTS": "1", "FAULT": "hang", "FAULT_RANK": "3", "FAULT_STEP": "2"}
    results = run(mpi_job(src, env), tmp_path, timeout_s=120)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["attempt"] == 1 and info["start"] == 2 for info in ranks.values()), ranks  # resumed at step 2
    lead = next(r for r in results if r.host == "algo-1")
    entries = record_at(lead.opt_ml, "algo-1")  # the stall, after the stall timeout without progress; its cost
    (stall,) = [item for item in of_kind(entries, "fault") if item["fault"] == "stall"]
    progress = [item["t"] for item in of_kind(entries, "progress") if item["attempt"] == 0]
    # both stamped at their steps' instants (4 s apart on the monotonic clock that times the stall); 10 ms for the
    # wall clock the record uses being slewed against it
    assert stall["attempt"] == 0 and progress and stall["t"] >= progress[0] + 4 - 0.01, entries
    cost = cost_at(lead.opt_ml, "algo-1")
    assert cost["basis"] == "progress" and cost["faults"][0]["fault"] == "stall" and cost["faults"][0]["lost_s"] > 0


@pytest.mark.root
@pytest.mark.torch
def test_torch_distributed_a_killed_rank_restarts_every_rank_which_resume(tmp_path):
    src = source_dir(tmp_path, "torch_restart.py")
    job = LocalJob(hosts=H2, env={**FAST, "TRAINING_TOOLKIT_MAX_RESTARTS": "1", "FAULT_RANK": "3"},
                   hyperparameters=hps("torch_restart.py", src, sagemaker_torch_distributed_enabled=True,
                                       sagemaker_distributed_processes_per_host=2))
    results = run(job, tmp_path, timeout_s=180)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["attempt"] == 1 and info["start"] == 2 for info in ranks.values()), ranks


@pytest.mark.root
@pytest.mark.tensorflow
def test_parameter_server_a_chief_failure_restarts_every_script_and_server(tmp_path):
    src = source_dir(tmp_path, "ps_train.py")
    job = LocalJob(hosts=("algo-1", "algo-2", "algo-3"),
                   env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2",
                        "TRAINING_TOOLKIT_MAX_RESTARTS": "1", "CHIEF_FAILS_ONCE": "1"},
                   hyperparameters=hps("ps_train.py", src, sagemaker_parameter_server_enabled=True))
    results = run(job, tmp_path, timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    chief = json.loads((results[0].model_dir / "chief.json").read_text())  # trained against restarted servers
    assert chief["last_loss"] < chief["first_loss"]


@pytest.mark.root
@pytest.mark.tensorflow
def test_multi_worker_mirrored_a_worker_failure_restarts_every_worker(tmp_path):
    src = source_dir(tmp_path, "mwms_train.py")
    # a worker waiting in the strategy's set-up outlives SIGTERM: a short grace keeps the test short
    job = LocalJob(hosts=H2, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2",
                                  "TRAINING_TOOLKIT_GRACE_PERIOD": "5",
                                  "TRAINING_TOOLKIT_MAX_RESTARTS": "1", "FAIL_ONCE_INDEX": "1"},
                   hyperparameters=hps("mwms_train.py", src, sagemaker_multi_worker_mirrored_strategy_enabled=True))
    results = run(job, tmp_path, timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    w0 = json.loads((results[0].model_dir / "worker-0.json").read_text())
    w1 = json.loads((results[1].model_dir / "worker-1.json").read_text())
    assert w0["weights"] == w1["weights"]
