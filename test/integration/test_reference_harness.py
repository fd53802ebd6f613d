"""The side-by-side harness (test/reference.py) drives the real reference
``sagemaker-training`` and captures what a user script sees.

Needs ``scripts/setup-reference.sh``; the tests that run the reference skip otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.reference import (
    REFERENCE_SM_VARS,
    comparable_env,
    make_tree,
    run_reference,
    write_dump_script,
)

requires_reference = pytest.mark.reference


def test_dump_script_alone(tmp_path):
    """The entry script itself, without the reference: dumps env, argv and cwd."""
    script = tmp_path / "dump_env.py"
    write_dump_script(script)
    out = tmp_path / "out.json"
    env = {**os.environ, "DUMP_TO": str(out), "DUMP_EXIT_CODE": "7"}
    rc = subprocess.run([sys.executable, str(script), "--a", "b c"], cwd=tmp_path, env=env).returncode
    assert rc == 7
    data = json.loads(out.read_text())
    assert data["argv"] == [str(script), "--a", "b c"]
    assert data["cwd"] == str(tmp_path)
    assert data["env"]["DUMP_TO"] == str(out)


@pytest.mark.reference
@requires_reference
def test_single_host_mixed_hyperparameters(tmp_path):
    base = tmp_path / "ml"
    pwned = tmp_path / "pwned"
    message = f"hello world; touch {pwned} 'single' \"double\""
    hps = {
        "epochs": "10",
        "learning-rate": "0.001",
        "use_cuda": "false",
        "optimizer": json.dumps("adam"),
        "message": message,
        "layers": "[64, 32]",
        "cfg": json.dumps({"b": 2, "a": "x"}),
        "x": "1.50",
        "sagemaker_job_name": json.dumps("job-1"),
        "sagemaker_mpi_num_of_processes_per_host": "4",
    }
    make_tree(base, hyperparameters=hps, resourceconfig=None, inputdataconfig=None, channels=["training"])

    cap = run_reference(base)

    assert cap.returncode == 0, cap.stderr[-2000:]
    assert cap.output_files == {"success": ""}
    # argv: sorted keys, -x for one-character keys, str() of the decoded values.
    assert cap.argv == [
        "dump_env.py",
        "--cfg", "a=x,b=2",
        "--epochs", "10",
        "--layers", "[64, 32]",
        "--learning-rate", "0.001",
        "--message", message,
        "--optimizer", "adam",
        "--use_cuda", "False",
        "-x", "1.5",
    ]
    assert cap.orig_argv[1] == "--"  # python -- dump_env.py ...
    assert not pwned.exists()
    env = cap.env
    assert cap.json_env("SM_USER_ARGS") == cap.argv[1:]
    assert env["SM_HOSTS"] == '["algo-1"]'
    assert env["SM_CURRENT_HOST"] == env["CURRENT_HOST"] == "algo-1"
    # SM_HP_*: strings raw, everything else compact JSON.
    assert env["SM_HP_EPOCHS"] == "10"
    assert env["SM_HP_LEARNING-RATE"] == "0.001"
    assert env["SM_HP_USE_CUDA"] == "false"
    assert env["SM_HP_OPTIMIZER"] == "adam"
    assert env["SM_HP_MESSAGE"] == message
    assert env["SM_HP_LAYERS"] == "[64,32]"
    assert env["SM_HP_CFG"] == '{"a":"x","b":2}'
    assert env["SM_HP_X"] == "1.5"
    assert cap.json_env("SM_HPS") == {
        "epochs": 10, "learning-rate": 0.001, "use_cuda": False, "optimizer": "adam",
        "message": message, "layers": [64, 32], "cfg": {"a": "x", "b": 2}, "x": 1.5,
    }
    assert cap.json_env("SM_FRAMEWORK_PARAMS") == {"sagemaker_mpi_num_of_processes_per_host": 4}
    assert env["SAGEMAKER_JOB_NAME"] == "job-1"
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "local"
    assert env["SM_IS_HETERO"] == "false"
    assert env["SM_CHANNELS"] == '["training"]'
    assert env["SM_CHANNEL_TRAINING"] == str(base / "input/data/training")
    assert env["SM_MODEL_DIR"] == str(base / "model")
    assert env["SM_OUTPUT_DATA_DIR"] == str(base / "output/data")
    assert env["SM_USER_ENTRY_POINT"] == "dump_env.py"
    assert env["SM_MODULE_NAME"] == "dump_env"
    assert env["SM_LOG_LEVEL"] == "20"
    # The submit dir is copied into the empty code dir, which is the cwd and on PYTHONPATH;
    # SM_MODULE_DIR keeps naming the submit dir.
    assert env["SM_MODULE_DIR"] == str(base / "submit")
    assert (base / "code" / "dump_env.py").is_file()
    assert cap.cwd == str(base / "code")
    assert env["PYTHONPATH"].split(":")[0] == str(base / "code")
    # Exactly the documented SM_ variables, and the parent's environment is inherited.
    sm = {k for k in env if k.startswith("SM_")}
    assert sm == REFERENCE_SM_VARS | {"SM_CHANNEL_TRAINING", "SM_STUDIO_LOCAL_MODE"} | {
        "SM_HP_" + k.upper() for k in cap.json_env("SM_HPS")
    }
    assert env["DUMP_TO"] and env["SAGEMAKER_BASE_DIR"] == str(base.resolve())
    assert "DUMP_TO" not in comparable_env(env) and "SM_NUM_CPUS" not in comparable_env(env)


@pytest.mark.reference
@requires_reference
def test_two_hosts_two_channels_heterogeneous(tmp_path):
    base = tmp_path / "ml"
    resourceconfig = {
        "current_host": "algo-2",
        "hosts": ["algo-1", "algo-2"],
        "current_group_name": "train-group",
        "current_instance_type": "ml.p3.2xlarge",
        "network_interface_name": "ethwe",
        "instance_groups": [
            {"instance_group_name": "data-group", "instance_type": "ml.c5.xlarge", "hosts": ["algo-1"]},
            {"instance_group_name": "train-group", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-2"]},
        ],
    }
    inputdataconfig = {
        "train": {"TrainingInputMode": "File", "S3DistributionType": "ShardedByS3Key", "RecordWrapperType": "None"},
        "validation": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"},
    }
    hps = {"batch_size": "32", "sagemaker_distribution_instance_groups": json.dumps(["train-group"])}
    make_tree(
        base,
        hyperparameters=hps,
        resourceconfig=resourceconfig,
        inputdataconfig=inputdataconfig,
        channels=["validation", "train"],
        submit="tar",
    )

    cap = run_reference(base)

    assert cap.returncode == 0, cap.stderr[-2000:]
    env = cap.env
    assert cap.argv == ["dump_env.py", "--batch_size", "32"]
    assert env["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert env["SM_CURRENT_HOST"] == "algo-2"
    assert env["SM_NETWORK_INTERFACE_NAME"] == "ethwe"
    assert env["SM_CHANNELS"] == '["train","validation"]'
    assert env["SM_CHANNEL_TRAIN"] == str(base / "input/data/train")
    assert env["SM_CHANNEL_VALIDATION"] == str(base / "input/data/validation")
    assert cap.json_env("SM_INPUT_DATA_CONFIG") == inputdataconfig
    assert cap.json_env("SM_RESOURCE_CONFIG") == resourceconfig
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "train-group"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.p3.2xlarge"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == '["algo-2"]'
    assert env["SM_INSTANCE_GROUPS"] == '["data-group","train-group"]'
    assert cap.json_env("SM_INSTANCE_GROUPS_DICT") == {
        g["instance_group_name"]: g for g in resourceconfig["instance_groups"]
    }
    assert env["SM_IS_HETERO"] == "true"
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["train-group"]'
    assert cap.json_env("SM_FRAMEWORK_PARAMS") == {"sagemaker_distribution_instance_groups": ["train-group"]}
    training_env = cap.json_env("SM_TRAINING_ENV")
    assert training_env["distribution_hosts"] == ["algo-2"]
    assert training_env["master_hostname"] == "algo-2"
    assert training_env["is_master"] is True
    # The local tarball was unpacked into the code dir.
    assert env["SM_MODULE_DIR"] == str(base / "submit" / "sourcedir.tar.gz")
    assert cap.cwd == str(base / "code") and (base / "code" / "dump_env.py").is_file()


@pytest.mark.reference
@requires_reference
def test_failing_script_exit_code_and_failure_file(tmp_path):
    base = tmp_path / "ml"
    make_tree(base, hyperparameters={"a": "1"}, resourceconfig=None, inputdataconfig=None)

    cap = run_reference(base, extra_env={"DUMP_EXIT_CODE": "3"})

    assert cap.ran
    assert cap.returncode == 1  # whatever the script's exit code
    failure = cap.output_files["failure"]
    assert failure.startswith("ExecuteUserScriptError:\nExitCode 3\n")
    assert "success" not in cap.output_files
