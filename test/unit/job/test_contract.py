import json
from pathlib import Path

from training_toolkit.job import contract
from training_toolkit.core.hardware import Hardware
from training_toolkit.job.spec import build_job
from training_toolkit.core.paths import Paths

HW = Hardware(num_cpus=8, num_gpus=2, num_neurons=0)


def spec(hps=None, rc=None, data=None, environ=None):
    rc = rc or {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth1"}
    return build_job(Paths(Path("/opt/ml")), hps or {}, rc, data or {}, environ or {}, HW)


def test_user_args_render_exactly_as_the_reference():
    hps = {"b": True, "lr": 0.1, "epochs": 10, "name": "a b; $(rm -rf /) 'q' \"d\"", "layers": [1, "x"],
           "opts": {"z": 1, "a": "b"}, "x": None, "e": "", "ü": "ñ", "f": False}
    assert contract.user_args(hps) == [
        "-b", "True", "-e", "", "--epochs", "10", "-f", "False", "--layers", "[1, 'x']", "--lr", "0.1",
        "--name", "a b; $(rm -rf /) 'q' \"d\"", "--opts", "a=b,z=1", "-x", "", "-ü", "ñ",
    ]


def test_env_values():
    assert contract.to_env_value("raw string") == "raw string"
    assert contract.to_env_value(None) == ""
    assert contract.to_env_value(True) == "true"
    assert contract.to_env_value({"b": [1, 2], "a": "é"}) == '{"a":"\\u00e9","b":[1,2]}'
    assert contract.to_env_value(0.5) == "0.5"


def test_sm_variables_for_a_two_host_job():
    job = spec({"lr": "0.1", "model-name": '"m"', "sagemaker_program": '"train.py"', "sagemaker_mpi_enabled": "true"},
               data={"train": {"TrainingInputMode": "File"}, "eval": {"TrainingInputMode": "Pipe"}})
    env = contract.sm_variables(job, {"PATH": "/nonexistent"})
    assert env["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert env["SM_CURRENT_HOST"] == "algo-2"
    assert env["SM_NETWORK_INTERFACE_NAME"] == "eth1"
    assert env["SM_HPS"] == '{"lr":0.1,"model-name":"m"}'
    assert env["SM_HP_LR"] == "0.1"
    assert env["SM_HP_MODEL-NAME"] == "m"
    assert env["SM_CHANNELS"] == '["eval","train"]'
    assert env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert env["SM_CHANNEL_EVAL"] == "/opt/ml/input/data/eval"
    assert env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data"
    assert env["SM_OUTPUT_INTERMEDIATE_DIR"] == "/opt/ml/output/intermediate"
    assert env["SM_INPUT_CONFIG_DIR"] == "/opt/ml/input/config"
    assert env["SM_NUM_CPUS"] == "8" and env["SM_NUM_GPUS"] == "2" and env["SM_NUM_NEURONS"] == "0"
    assert env["SM_USER_ENTRY_POINT"] == "train.py"
    assert env["SM_MODULE_NAME"] == "train"
    assert env["SM_MODULE_DIR"] == "/opt/ml/code"
    assert env["SM_USER_ARGS"] == '["--lr","0.1","--model-name","m"]'
    assert env["SM_FRAMEWORK_PARAMS"] == '{"sagemaker_mpi_enabled":true}'
    assert env["SM_FRAMEWORK_MODULE"] == ""
    assert env["SM_LOG_LEVEL"] == "20"
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == "[]"
    assert env["SM_INSTANCE_GROUPS"] == "[]"
    assert env["SM_INSTANCE_GROUPS_DICT"] == "{}"
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["homogeneousCluster"]'
    assert env["SM_IS_HETERO"] == "false"
    assert "SM_TOPOLOGY" not in env
    training = json.loads(env["SM_TRAINING_ENV"])
    assert training["master_hostname"] == "algo-1" and training["is_master"] is False
    assert training["distribution_hosts"] == ["algo-1", "algo-2"]
    assert training["is_smddprun_installed"] is False


def test_heterogeneous_groups():
    rc = {"current_host": "algo-3", "hosts": ["algo-1", "algo-2", "algo-3"], "current_group_name": "cpu",
          "current_instance_type": "ml.c5.xlarge",
          "instance_groups": [{"instance_group_name": "gpu", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-2", "algo-1"]},
                              {"instance_group_name": "cpu", "instance_type": "ml.c5.xlarge", "hosts": ["algo-3"]}]}
    job = spec({"sagemaker_distribution_instance_groups": '["gpu"]'}, rc=rc)
    env = contract.sm_variables(job, {})
    assert env["SM_IS_HETERO"] == "true"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == '["algo-3"]'
    assert env["SM_INSTANCE_GROUPS"] == '["gpu","cpu"]'
    assert json.loads(env["SM_INSTANCE_GROUPS_DICT"])["gpu"]["hosts"] == ["algo-2", "algo-1"]
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["gpu"]'
    training = json.loads(env["SM_TRAINING_ENV"])
    assert training["distribution_hosts"] == ["algo-2", "algo-1"]
    assert training["master_hostname"] == "algo-2"


def test_script_environment_keeps_parent_adds_platform_variables_and_pythonpath():
    job = spec({"sagemaker_job_name": '"job-7"', "sagemaker_program": '"t.py"'})
    env = contract.script_environment(job, {"PATH": "/bin", "PYTHONPATH": "/x:/opt/ml/code", "HOME": "/root"})
    assert env["PATH"] == "/bin" and env["HOME"] == "/root"
    assert env["PYTHONPATH"] == "/opt/ml/code:/x"
    assert env["SAGEMAKER_JOB_NAME"] == "job-7"
    assert env["TRAINING_JOB_NAME"] == "job-7"
    assert env["CURRENT_HOST"] == "algo-2"
    assert env["SAGEMAKER_PROGRAM"] == "t.py"
    assert contract.script_environment(job, {}, {"SM_CURRENT_HOST": "x"})["SM_CURRENT_HOST"] == "x"


def test_the_job_secret_never_reaches_the_script():
    job = spec()
    env = contract.script_environment(job, {"TRAINING_TOOLKIT_JOB_SECRET": "s3cr3t" * 4, "KEEP": "1"})
    assert "TRAINING_TOOLKIT_JOB_SECRET" not in env and env["KEEP"] == "1"
    assert "s3cr3t" not in env["SM_TRAINING_ENV"]
