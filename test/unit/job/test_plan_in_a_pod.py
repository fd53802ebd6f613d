"""``plan`` in a pod shows what ``run`` would do there, from the same view, and touches nothing."""

import json

from training_toolkit import cli

POD = {"KUBERNETES_SERVICE_HOST": "192.0.2.1", "MASTER_ADDR": "p-master-0", "MASTER_PORT": "23456", "RANK": "1",
       "WORLD_SIZE": "4", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2",
       "TRAINING_TOOLKIT_HYPERPARAMETERS": '{"sagemaker_program": "train.py", "epochs": 3}',
       "TRAINING_TOOLKIT_JOB_SECRET": "s" * 32}


def test_plan_shows_the_platforms_view_and_writes_nothing(tmp_path, capsys):
    base = tmp_path / "opt_ml"
    environ = {**POD, "SAGEMAKER_BASE_DIR": str(base), "TRAINING_TOOLKIT_HYPERPARAMETERS_FILE": str(tmp_path / "none")}
    assert cli.show_plan(None, True, environ) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["platform"], doc["current_host"], doc["hosts"]) == ("pytorchjob", "p-worker-0",
                                                                     ["p-master-0", "p-worker-0"])
    assert doc["runner"] == "torch_distributed" and doc["command"][-2:] == ["--epochs", "3"]
    assert "s" * 32 not in json.dumps(doc)
    assert not base.exists()  # no view written, no run recorded, no DNS waited for


def test_plan_names_a_bad_fact_as_run_would(tmp_path, capsys):
    environ = {**POD, "SAGEMAKER_BASE_DIR": str(tmp_path), "PET_NPROC_PER_NODE": "many",
               "TRAINING_TOOLKIT_HYPERPARAMETERS_FILE": str(tmp_path / "none")}
    assert cli.show_plan(None, False, environ) == 78
    assert "PET_NPROC_PER_NODE: expected a number, auto, gpu or cpu, got 'many'" in capsys.readouterr().err


def test_a_bad_setting_in_a_pod_reaches_the_termination_log(tmp_path):
    log_file = tmp_path / "termination-log"
    environ = {"KUBERNETES_SERVICE_HOST": "192.0.2.1", "SAGEMAKER_BASE_DIR": str(tmp_path / "opt_ml"),
               "TRAINING_TOOLKIT_JOIN_TIMEOUT": "soon", "TRAINING_TOOLKIT_TERMINATION_LOG": str(log_file)}
    assert cli.run(None, None, environ) == 78
    assert log_file.read_text() == ("environment variable TRAINING_TOOLKIT_JOIN_TIMEOUT: expected a positive number "
                                    "of seconds, got 'soon'\n")
    assert (tmp_path / "opt_ml/output/failure").read_text().startswith("environment variable")
