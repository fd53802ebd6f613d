"""The single runner end to end: real `train`, real child processes, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil

from helpers.jobs import clean_env, train_cmd, write_job


def run_train(base: Path, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd() + ["--base-dir", str(base)], capture_output=True, timeout=timeout,
                          env=kw.pop("env", clean_env()), **kw)


def start_train(base: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(train_cmd() + ["--base-dir", str(base), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env())


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_success_writes_success_and_model(job_dir):
    write_job(job_dir, script="import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'm'), 'w').write('ok')\n")
    (job_dir / "model").mkdir()
    result = run_train(job_dir)
    assert result.returncode == 0, result.stderr
    assert (job_dir / "output" / "success").exists()
    assert not (job_dir / "output" / "failure").exists()
    assert (job_dir / "model" / "m").read_text() == "ok"


def test_exit_code_passes_through_and_failure_names_the_cause(job_dir):
    write_job(job_dir, script="import sys\nprint('working')\nraise SystemExit(sys.stderr.write('ValueError: bad batch\\n') and 3)\n")
    result = run_train(job_dir)
    assert result.returncode == 3
    assert b"working" in result.stdout
    failure = (job_dir / "output" / "failure").read_text()
    first = failure.splitlines()[0]
    assert "train.py exited with code 3" in first and "ValueError: bad batch" in first
    assert "command: " in failure and "last lines of stderr:" in failure
    assert not (job_dir / "output" / "success").exists()


def test_killed_by_sigkill_is_named_as_likely_oom(job_dir):
    write_job(job_dir, script="import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = run_train(job_dir)
    assert result.returncode == 128 + 9
    assert "killed by SIGKILL: likely out of memory" in (job_dir / "output" / "failure").read_text()


def test_script_written_failure_file_is_kept(job_dir):
    write_job(job_dir, script="import os\nos.makedirs('/tmp', exist_ok=True)\n"
                              "open(os.path.join(os.environ['SM_OUTPUT_DIR'], 'failure'), 'w').write('my reason')\n"
                              "raise SystemExit(2)\n")
    (job_dir / "output").mkdir(parents=True)
    assert run_train(job_dir).returncode == 2
    assert (job_dir / "output" / "failure").read_text() == "my reason"


def test_stale_verdict_from_an_earlier_run_is_cleared(job_dir):
    write_job(job_dir, script="pass\n")
    (job_dir / "output").mkdir(parents=True)
    (job_dir / "output" / "failure").write_text("old")
    assert run_train(job_dir).returncode == 0
    assert not (job_dir / "output" / "failure").exists()


def test_hostile_hyperparameters_reach_argv_intact(job_dir):
    hps = {"name": "a b; echo pwned $(id) `id` 'q' \"d\" | & > /tmp/x", "empty": "", "uni": "ünï \u2603",
           "n": 3, "flag": True, "lst": [1, "a"]}
    write_job(job_dir, hyperparameters={k: json.dumps(v) for k, v in hps.items()},
              script="import sys, json, os\nprint(json.dumps(sys.argv[1:]))\n")
    result = run_train(job_dir)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert argv == ["--empty", "", "--flag", "True", "--lst", "[1, 'a']", "-n", "3",
                    "--name", hps["name"], "--uni", hps["uni"]]


def test_output_is_byte_exact(job_dir):
    payload = b"line one\r\npartial \xff\xfe invalid utf8 \x00 nul\rcarriage" + "ü€".encode() + b"no newline at end"
    script = ("import sys, os\n"
              f"data = {payload!r}\n"
              "for i in range(0, len(data), 7):\n"
              "    os.write(1, data[i:i+7]); os.write(2, data[i:i+7])\n")
    write_job(job_dir, script=script)
    result = run_train(job_dir)
    assert result.returncode == 0
    assert result.stdout == payload
    assert result.stderr == payload


def test_sigterm_reaches_the_script_and_its_code_is_returned(job_dir, tmp_path):
    marker = tmp_path / "got-term"
    started = tmp_path / "started"
    write_job(job_dir, script=(
        "import signal, sys, time, pathlib\n"
        f"def stop(*_):\n    pathlib.Path({str(marker)!r}).write_text('term')\n    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(60)\n"))
    proc = start_train(job_dir)
    wait_for(started)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 143
    assert marker.read_text() == "term"
    assert "train.py exited with code 143" in (job_dir / "output" / "failure").read_text()


def test_sigusr1_is_forwarded_and_the_script_goes_on(job_dir, tmp_path):
    started = tmp_path / "started"
    write_job(job_dir, script=(
        "import signal, time, pathlib, sys\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "deadline = time.time() + 20\n"
        "while not got and time.time() < deadline:\n    time.sleep(0.01)\n"
        "print('usr1' if got else 'none')\n"))
    proc = start_train(job_dir)
    wait_for(started)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == b"usr1"


def test_script_ignoring_sigterm_is_killed_after_the_grace_period(job_dir, tmp_path):
    started = tmp_path / "started"
    write_job(job_dir, script=(
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(120)\n"))
    proc = start_train(job_dir, "--grace-period", "1")
    wait_for(started)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 137
    assert 0.9 < time.monotonic() - t0 < 10
    assert "after the stop grace period" in (job_dir / "output" / "failure").read_text()


def test_nothing_is_left_running(job_dir, tmp_path):
    pids = tmp_path / "pids"
    write_job(job_dir, script=(
        "import subprocess, os, sys\n"
        "a = subprocess.Popen(['sleep', '300'])\n"
        "b = subprocess.Popen(['sleep', '301'], start_new_session=True)\n"
        "c = subprocess.Popen(['sh', '-c', 'sleep 302 & echo $!'], stdout=subprocess.PIPE)\n"
        "grand = c.stdout.readline().strip().decode()\n"
        f"open({str(pids)!r}, 'w').write(' '.join([str(a.pid), str(b.pid), grand]))\n"
        "sys.exit(0)\n"))
    result = run_train(job_dir, timeout=30)
    assert result.returncode == 0, result.stderr
    left = [int(p) for p in pids.read_text().split()]
    time.sleep(0.2)
    alive = [p for p in left if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes left running: {alive}"


def test_sigint_before_the_job_ends_leaves_nothing(job_dir, tmp_path):
    started = tmp_path / "started"
    write_job(job_dir, script=(
        "import subprocess, time, pathlib\n"
        "subprocess.Popen(['sleep', '303'])\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(60)\n"))
    proc = start_train(job_dir)
    wait_for(started)
    child_pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 130
    time.sleep(0.2)
    assert not [p for p in child_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_environment_reaches_the_script(job_dir):
    write_job(job_dir, hyperparameters={"lr": "0.5"},
              inputdataconfig={"train": {"TrainingInputMode": "File"}},
              script="import os, json\nprint(json.dumps({k: v for k, v in os.environ.items()}))\n")
    result = run_train(job_dir)
    env = json.loads(result.stdout.decode().splitlines()[-1])
    assert env["SM_HP_LR"] == "0.5"
    assert env["SM_CHANNEL_TRAIN"] == str(job_dir / "input" / "data" / "train")
    assert env["PYTHONPATH"].split(":")[0] == str(job_dir / "code")
    assert env["SM_USER_ARGS"] == '["--lr","0.5"]'


def test_a_toolkit_bug_still_gives_a_verdict(job_dir, tmp_path):
    """An unexpected exception inside the toolkit: exit 70 and a failure file, not a bare traceback exit."""
    write_job(job_dir, script="pass\n")
    boom = tmp_path / "sitecustomize.py"
    boom.write_text("import training_toolkit.job.contract as c\n"
                    "def broken(*a, **k):\n    raise RuntimeError('simulated bug')\n"
                    "c.script_environment = broken\n")
    env = clean_env(PYTHONPATH=str(tmp_path))
    result = run_train(job_dir, env=env)
    assert result.returncode == 70
    assert "training-toolkit internal error: RuntimeError('simulated bug')" in (job_dir / "output" / "failure").read_text()
    assert b"Traceback" in result.stderr


def test_a_framework_training_module_is_refused_by_name_before_anything_runs(job_dir, tmp_path):
    marker = tmp_path / "ran"
    write_job(job_dir, script=f"open({str(marker)!r}, 'w').close()\n")
    result = run_train(job_dir, env={**clean_env(), "SAGEMAKER_TRAINING_MODULE": "sagemaker_pytorch_container.training:main"})
    assert result.returncode == 78
    assert not marker.exists()
    first = (job_dir / "output" / "failure").read_text().splitlines()[0]
    assert "SAGEMAKER_TRAINING_MODULE: 'sagemaker_pytorch_container.training:main'" in first, first
    assert b"SAGEMAKER_TRAINING_MODULE" in result.stderr
