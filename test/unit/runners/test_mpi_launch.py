"""What the first host launches and each rank sees, built from an attempt's hosts (runners/mpi_launch.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from training_toolkit import contract, settings
from training_toolkit.hardware import Hardware
from training_toolkit.job import build_job
from training_toolkit.names import OPENMPI4
from training_toolkit.paths import Paths
from training_toolkit.plan import make_plan
from training_toolkit.runners import rank_env
from training_toolkit.runners.mpi_launch import build_command, rank_environment
from training_toolkit.runspec import RunContext, with_hosts

JOB = ("algo-1", "algo-2", "algo-3", "algo-4")
HPS = {"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2",
       "sagemaker_program": '"train.py"'}


def context(tmp_path: Path, current: str) -> RunContext:
    paths = Paths(tmp_path / "opt_ml")
    paths.resource_config_file.parent.mkdir(parents=True)
    job = build_job(paths, HPS, {"current_host": current, "hosts": list(JOB), "network_interface_name": "eth0"}, {},
                    {}, Hardware(1, 0, 0))
    environ = {"PATH": "/usr/bin:/bin"}
    return RunContext(job, make_plan(job), settings.parse({}), environ, contract.script_environment(job, environ),
                      (sys.executable, "train.py"), tmp_path, sys.executable)


def hosts_and_np(command: list[str]) -> tuple[str, str]:
    return command[command.index("--host") + 1], command[command.index("-np") + 1]


def test_mpiruns_hosts_and_np_are_the_attempts_and_its_ranks_wait_for_that_attempts_file(tmp_path):
    ctx = context(tmp_path, "algo-1")
    assert hosts_and_np(build_command(ctx, None, OPENMPI4, 0)) == ("algo-1:2,algo-2:2,algo-3:2,algo-4:2", "8")
    seated = with_hosts(ctx, ("algo-1", "algo-4", "algo-3"))  # a spare in algo-2's seat
    command = build_command(seated, None, OPENMPI4, 1)
    assert hosts_and_np(command) == ("algo-1:2,algo-4:2,algo-3:2", "6")
    assert Path(command[-3]).name == "training-toolkit-rank" and command[-2:] == [rank_env.ATTEMPT_FLAG, "1"]
    shrunk = with_hosts(ctx, ("algo-1", "algo-3"))
    assert hosts_and_np(build_command(shrunk, None, OPENMPI4, 2)) == ("algo-1:2,algo-3:2", "4")


def test_each_ranks_environment_names_the_attempts_hosts_and_the_attempt(tmp_path):
    ctx = with_hosts(context(tmp_path, "algo-4"), ("algo-1", "algo-4", "algo-3"))
    env = rank_environment(ctx, "0a1b", attempt=1)
    assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-4", "algo-3"] and env["SM_CURRENT_HOST"] == "algo-4"
    assert json.loads(env["SM_RESOURCE_CONFIG"])["hosts"] == ["algo-1", "algo-4", "algo-3"]
    assert json.loads(env["SM_TRAINING_ENV"])["hosts"] == ["algo-1", "algo-4", "algo-3"]
    assert json.loads(ctx.job.paths.resource_config_file.read_text())["hosts"] == ["algo-1", "algo-4", "algo-3"]
    assert env[rank_env.ATTEMPT_VAR] == "1"
    assert rank_env.ATTEMPT_VAR not in rank_environment(ctx, "0a1b")  # of no attempt: no rank starts from it


def test_a_fixed_number_of_processes_that_a_shrink_cannot_fit_is_refused_naming_it(tmp_path):
    import pytest

    from training_toolkit.errors import ConfigError

    ctx = context(tmp_path, "algo-1")
    fixed = ctx._replace(job=ctx.job._replace(framework_params={**ctx.job.framework_params,
                                                                "sagemaker_mpi_num_processes": 6}))
    with pytest.raises(ConfigError, match="sagemaker_mpi_num_processes.*6 processes do not fit 2 host"):
        with_hosts(fixed, ("algo-1", "algo-3"))
