"""Parameter servers and MultiWorkerMirroredStrategy with real TensorFlow on local clusters."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers.multihost import hps, run, source_dir
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.tensorflow]

H3 = ("algo-1", "algo-2", "algo-3")
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2"}


def spread(results) -> float:
    ended = [r.ended_at for r in results]
    return max(ended) - min(ended)


def ps_job(src: Path, script="ps_train.py", env=None, **extra) -> LocalJob:
    return LocalJob(hosts=H3, hyperparameters=hps(script, src, sagemaker_parameter_server_enabled=True, **extra),
                    env={**FAST, **(env or {})})


def test_parameter_server_strategy_trains_and_ends_with_the_chief(tmp_path):
    src = source_dir(tmp_path, "ps_train.py")
    results = run(ps_job(src), tmp_path, timeout_s=180)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    assert all(r.success for r in results)
    chief = json.loads((results[0].model_dir / "chief.json").read_text())
    assert chief["last_loss"] < chief["first_loss"] / 10
    config = json.loads((results[0].model_dir / "tf_config-chief-0.json").read_text())
    assert config["cluster"] == {"chief": ["algo-1:2222"], "worker": ["algo-2:2222", "algo-3:2222"],
                                 "ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}
    assert json.loads((results[2].model_dir / "tf_config-worker-1.json").read_text())["task"] == {"type": "worker", "index": 1}
    assert spread(results) < 1.0, f"hosts ended {spread(results):.2f} s apart"


def test_estimator_era_script_gets_master_naming(tmp_path):
    src = source_dir(tmp_path, "tf_config_reader.py")
    job = ps_job(src, "tf_config_reader.py", env={"WORKER_SERVES": "1", "MASTER_DELAY": "2"},
                 sagemaker_parameter_server_naming="master")
    results = run(job, tmp_path, timeout_s=120)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    master = json.loads((results[0].model_dir / "tf_config.json").read_text())
    assert master["task"] == {"type": "master", "index": 0} and master["environment"] == "cloud"
    assert json.loads((results[1].model_dir / "tf_config.json").read_text())["task"] == {"type": "worker", "index": 0}
    assert spread(results) < 1.0


def test_workers_that_finish_early_are_fine_and_the_chief_decides(tmp_path):
    src = source_dir(tmp_path, "tf_config_reader.py")
    job = ps_job(src, "tf_config_reader.py", env={"MASTER_DELAY": "2"}, sagemaker_parameter_server_naming="master")
    results = run(job, tmp_path, timeout_s=120)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    assert all(r.success for r in results)


def test_chief_failure_is_every_hosts_verdict(tmp_path):
    src = source_dir(tmp_path, "tf_config_reader.py")
    job = ps_job(src, "tf_config_reader.py", env={"WORKER_SERVES": "1", "EXIT_CODE": "4"},
                 sagemaker_parameter_server_naming="master")
    results = run(job, tmp_path, timeout_s=120)
    assert [r.exit_code for r in results] == [4, 4, 4]
    assert all("algo-1: tf_config_reader.py exited with code 4" in r.failure.splitlines()[0] for r in results)


def test_a_killed_parameter_server_fails_the_job_everywhere(tmp_path):
    src = source_dir(tmp_path, "tf_config_reader.py")
    job = ps_job(src, "tf_config_reader.py", env={"WORKER_SERVES": "1"}, sagemaker_parameter_server_naming="master")
    job = LocalJob(**{**job.__dict__, "env": {**job.env, "EXIT_CODE": "0"}})
    # the master's script exits at once here, so make it serve too: run it as a worker would
    job = LocalJob(**{**job.__dict__, "host_env": {"algo-1": {"MASTER_SERVES": "1"}}})

    def kill_ps_on_algo_2(procs):
        def later():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for child in psutil.Process(procs["algo-2"].pid).children(recursive=True):
                    if "runners/ps_server.py" in " ".join(child.cmdline()):
                        time.sleep(1.0)
                        child.send_signal(signal.SIGKILL)
                        return
                time.sleep(0.1)
        threading.Thread(target=later, daemon=True).start()

    src_script = src / "tf_config_reader.py"
    src_script.write_text(src_script.read_text().replace(
        'if role == "worker" and os.environ.get("WORKER_SERVES"):',
        'if os.environ.get("MASTER_SERVES") or (role == "worker" and os.environ.get("WORKER_SERVES")):'))
    t0 = time.monotonic()
    results = run(job, tmp_path, timeout_s=120, on_start=kill_ps_on_algo_2)
    assert time.monotonic() - t0 < 60
    for r in results:
        assert r.exit_code not in (0, None), (r.host, r.exit_code)
        first = r.failure.splitlines()[0]
        assert "algo-2" in first and "parameter server" in first and "SIGKILL" in first, first
    assert spread(results) < 3.0


def test_multi_worker_mirrored_strategy_ends_with_identical_weights(tmp_path):
    src = source_dir(tmp_path, "mwms_train.py")
    job = LocalJob(hosts=("algo-1", "algo-2"), env=FAST,
                   hyperparameters=hps("mwms_train.py", src, sagemaker_multi_worker_mirrored_strategy_enabled=True))
    results = run(job, tmp_path, timeout_s=180)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    w0 = json.loads((results[0].model_dir / "worker-0.json").read_text())
    w1 = json.loads((results[1].model_dir / "worker-1.json").read_text())
    assert w0["weights"] == w1["weights"]
    assert w0["last_loss"] < w0["first_loss"] / 5
    assert spread(results) < 1.0
