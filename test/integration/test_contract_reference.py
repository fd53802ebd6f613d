"""Our `train` and the reference's `train` on the same trees: the script must see the same world.

Every configuration runs both toolkits and compares the user script's whole
environment, argv and working directory.  Only the deliberate differences of
docs/contract.md are set aside.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import reference
from helpers.paths import BIN

pytestmark = [
    pytest.mark.reference,
]

# What we add on purpose (docs/contract.md, "Deliberate differences").
OUR_ADDITIONS = {"TRAINING_TOOLKIT_SUPERVISOR", "SAGEMAKER_PROGRAM", "TRAINING_JOB_NAME", "TRAINING_TOOLKIT_RESTART_COUNT",
                 "TRAINING_TOOLKIT_HEARTBEAT_DIR"}


def run_ours(base: Path, extra_env: dict | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="ours-dump-") as tmp:
        dump = Path(tmp) / "dump.json"
        env = reference._base_env()
        env.update({"SAGEMAKER_BASE_DIR": str(base), reference.DUMP_ENV_VAR: str(dump), "SM_STUDIO_LOCAL_MODE": "true"})
        env.update(extra_env or {})
        proc = subprocess.run([str(BIN / "train")], env=env, capture_output=True, text=True, timeout=60, cwd=str(base))
        assert proc.returncode == 0, proc.stderr
        return json.loads(dump.read_text())


def compare(tmp_path: Path, *, hyperparameters: dict, resourceconfig: dict | None = None,
            inputdataconfig: dict | None = None, channels=(), submit="dir", extra_env=None):
    trees = []
    for name in ("ref", "ours"):
        base = tmp_path / name / "opt" / "ml"  # same depth, so paths differ only in the prefix
        reference.make_tree(base, hyperparameters=hyperparameters, resourceconfig=resourceconfig,
                            inputdataconfig=inputdataconfig, channels=channels, submit=submit)
        trees.append(base)
    ref = reference.run_reference(trees[0], extra_env=extra_env)
    assert ref.ran, ref.stderr
    ours = run_ours(trees[1], extra_env)

    def normalise(env: dict, base: Path) -> dict:
        env = reference.comparable_env({k: v for k, v in env.items() if k not in OUR_ADDITIONS})
        text = json.dumps(env, sort_keys=True).replace(str(base), "<BASE>")
        env = json.loads(text)
        training = json.loads(env["SM_TRAINING_ENV"])
        for key in ("num_cpus", "num_gpus", "num_neurons"):
            training.pop(key)
        env["SM_TRAINING_ENV"] = training
        return env

    ref_env, our_env = normalise(ref.env, trees[0]), normalise(ours["env"], trees[1])
    assert sorted(our_env) == sorted(ref_env)
    for key in ref_env:
        assert our_env[key] == ref_env[key], key
    assert ours["argv"] == ref.argv
    assert ours["cwd"].replace(str(trees[1]), "") == ref.cwd.replace(str(trees[0]), "")
    return ref, ours


HOSTILE = {
    "message": '"hello world; touch /tmp/pwned \'single\' \\"double\\" $(id) `id`"',
    "learning-rate": "0.001", "epochs": "10", "use_cuda": "false", "x": "1.5", "layers": "[64, 32]",
    "cfg": '{"b": 2, "a": "x"}', "raw": "not json at all", "empty": '""', "nothing": "null",
    "unicode": '"ünïcödé ☃"', "True_str": "True", "big": "1e3", "neg": "-3",
}


def test_single_host_hostile_hyperparameters(tmp_path):
    compare(tmp_path, hyperparameters=HOSTILE, channels=["training"])


def test_reserved_and_framework_parameters(tmp_path):
    hps = {"lr": "0.1", "sagemaker_job_name": '"job-42"', "sagemaker_region": '"eu-west-1"',
           "sagemaker_container_log_level": "10", "sagemaker_enable_cloudwatch_metrics": "false",
           "sagemaker_s3_output": '"s3://b/out"', "_tuning_objective_metric": '"loss"',
           "sagemaker_custom_thing": '{"k": [1, 2]}', "default_user_module_name": '"x"'}
    compare(tmp_path, hyperparameters=hps, channels=["train", "eval", "test"])


def test_two_hosts_worker_side(tmp_path):
    rc = {"current_host": "localhost", "hosts": ["algo-1", "localhost"], "network_interface_name": "eth1"}
    compare(tmp_path, hyperparameters={"a": "1"}, resourceconfig=rc, channels=["b", "a"])


def test_heterogeneous_cluster_with_distribution_groups(tmp_path):
    rc = {"current_host": "localhost", "hosts": ["algo-1", "localhost", "algo-3"], "current_group_name": "cpu",
          "current_instance_type": "ml.c5.xlarge", "network_interface_name": "eth0",
          "instance_groups": [
              {"instance_group_name": "gpu", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-1"]},
              {"instance_group_name": "cpu", "instance_type": "ml.c5.xlarge", "hosts": ["localhost", "algo-3"]}]}
    compare(tmp_path, hyperparameters={"sagemaker_distribution_instance_groups": '["cpu"]', "k": '"v"'},
            resourceconfig=rc, channels=["train"])
    compare(tmp_path / "no-dist", hyperparameters={"k": '"v"'}, resourceconfig=rc)


def test_tarball_submit_and_code_in_place(tmp_path):
    compare(tmp_path / "tar", hyperparameters={"n": "2"}, submit="tar")
    compare(tmp_path / "none", hyperparameters={"n": "2"}, submit="none")


def test_inherited_environment_and_program_override(tmp_path):
    extra = {"TRAINING_JOB_NAME": "from-platform", "AWS_REGION": "us-west-2", "SAGEMAKER_PROGRAM": "dump_env.py",
             "SM_HP_MP_PARAMETERS": '{"a": 1}', "MY_VAR": "kept"}
    ref, ours = compare(tmp_path, hyperparameters={"sagemaker_program": '"missing.py"', "z": "1"}, extra_env=extra)
    assert ours["env"]["MY_VAR"] == "kept"
    assert json.loads(ours["env"]["SM_TRAINING_ENV"])["job_name"] == "from-platform"


def test_command_entry_point_sees_the_same_argv(tmp_path):
    """A non-.py entry point: the reference goes through /bin/sh with quoted arguments, we exec it; the script sees the same."""
    compare(tmp_path, hyperparameters={"message": '"a b; echo $HOME \'q\'"', "n": "3"}, submit="dir")
    trees = []
    for name in ("ref", "ours"):
        base = tmp_path / "cmd" / name / "opt" / "ml"
        reference.make_tree(base, hyperparameters={"message": '"a b; echo $HOME \'q\'"', "flag": "true"},
                            resourceconfig=None, inputdataconfig=None, entry_point="dump_env")
        trees.append(base)
    ref = reference.run_reference(trees[0])
    assert ref.ran, ref.stderr
    ours = run_ours(trees[1])
    assert ours["argv"][1:] == ref.argv[1:] == ["--flag", "True", "--message", "a b; echo $HOME 'q'"]
