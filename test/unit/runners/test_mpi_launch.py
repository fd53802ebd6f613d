"""What the lead launches and each rank sees, built from an attempt's hosts (runners/mpi_launch.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from training_toolkit.job import contract

from training_toolkit.config import settings
from training_toolkit.core.hardware import Hardware
from training_toolkit.job.spec import build_job
from training_toolkit.core.names import OPENMPI4
from training_toolkit.core.paths import Paths
from training_toolkit.job.plan import make_plan
from training_toolkit.runners import rank_env
from training_toolkit.runners.mpi_launch import build_command, in_slurm_order, rank_environment, slurm_environment
from training_toolkit.job.attempt import Attempt
from training_toolkit.runspec import RunContext, for_attempt

JOB = ("algo-1", "algo-2", "algo-3", "algo-4")
HPS = {"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2",
       "sagemaker_program": '"train.py"'}


def context(tmp_path: Path, current: str, hps: dict = HPS) -> RunContext:
    paths = Paths(tmp_path / "opt_ml")
    paths.resource_config_file.parent.mkdir(parents=True)
    job = build_job(paths, hps, {"current_host": current, "hosts": list(JOB), "network_interface_name": "eth0"}, {},
                    {}, Hardware(1, 0, 0))
    environ = {"PATH": "/usr/bin:/bin"}
    return RunContext(job, make_plan(job), settings.parse({}), environ, contract.script_environment(job, environ),
                      (sys.executable, "train.py"), tmp_path, sys.executable)


def hosts_and_np(command: list[str]) -> tuple[str, str]:
    return command[command.index("--host") + 1], command[command.index("-np") + 1]


def test_mpiruns_hosts_and_np_are_the_attempts_and_its_ranks_wait_for_that_attempts_file(tmp_path):
    """Through Slurm (no ssh layout): each host once per rank, in the seating's order, placed by name (map-by seq)."""
    ctx = context(tmp_path, "algo-1")
    assert hosts_and_np(build_command(ctx, None, OPENMPI4, 0)) == (
        "algo-1,algo-1,algo-2,algo-2,algo-3,algo-3,algo-4,algo-4", "8")
    seated = for_attempt(ctx, Attempt(1, ("algo-1", "algo-4", "algo-3")))  # a spare in algo-2's seat
    command = build_command(seated, None, OPENMPI4, 1)
    assert hosts_and_np(command) == ("algo-1,algo-1,algo-4,algo-4,algo-3,algo-3", "6")
    assert command[command.index("--map-by") + 1] == "seq"
    assert Path(command[-3]).name == "training-toolkit-rank" and command[-2:] == [rank_env.ATTEMPT_FLAG, "1"]
    shrunk = for_attempt(ctx, Attempt(1, ("algo-1", "algo-3")))
    assert hosts_and_np(build_command(shrunk, None, OPENMPI4, 2)) == ("algo-1,algo-1,algo-3,algo-3", "4")


def test_in_slurm_order_table():
    slurm = ("node1", "node2", "node3", "node4")
    for hosts, expected in [
        (("node1", "node4", "node3"), ("node1", "node3", "node4")),  # a spare in node2's seat
        (("node3", "node1"), ("node1", "node3")),  # the first host need not be Slurm's first
        (("node1", "node2"), ("node1", "node2")),  # already in order: unchanged
        (("node1", "other", "node4", "extra"), ("node1", "node4", "other", "extra")),  # unknown: last, in order
        ((), ()),
    ]:
        assert in_slurm_order(hosts, slurm) == expected, hosts
    # Slurm's order is its node table's, not the names' (a slurm.conf listing node10 before node9)
    assert in_slurm_order(("node9", "node10"), ("node10", "node9")) == ("node10", "node9")


def test_slurm_nodelist_is_in_slurms_order_whatever_the_seating(tmp_path):
    ctx = context(tmp_path, "algo-1")
    ctx = ctx._replace(environ={**ctx.environ, "SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm/slurm.conf"})
    seated = for_attempt(ctx, Attempt(1, ("algo-1", "algo-4", "algo-3")))
    assert slurm_environment(seated, ctx.plan.hosts) == {
        "SLURM_JOB_ID": "7", "SLURM_JOBID": "7", "SLURM_NODELIST": "algo-1,algo-3,algo-4",
        "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_CONF": "/etc/slurm/slurm.conf"}
    # without the platform's order (training-toolkit plan: the job's own hosts), the context's hosts as they are
    assert slurm_environment(ctx)["SLURM_NODELIST"] == "algo-1,algo-2,algo-3,algo-4"


def test_each_ranks_environment_names_the_attempts_hosts_and_the_attempt(tmp_path):
    ctx = for_attempt(context(tmp_path, "algo-4"), Attempt(1, ("algo-1", "algo-4", "algo-3")))
    env = rank_environment(ctx, "0a1b", attempt=1)
    assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-4", "algo-3"] and env["SM_CURRENT_HOST"] == "algo-4"
    assert json.loads(env["SM_RESOURCE_CONFIG"])["hosts"] == ["algo-1", "algo-4", "algo-3"]
    assert json.loads(env["SM_TRAINING_ENV"])["hosts"] == ["algo-1", "algo-4", "algo-3"]
    assert env[rank_env.ATTEMPT_VAR] == "1"
    assert rank_env.ATTEMPT_VAR not in rank_environment(ctx, "0a1b")  # of no attempt: no rank starts from it


def test_a_fixed_number_of_processes_that_a_shrink_cannot_fit_is_refused_naming_it(tmp_path):
    import pytest

    from training_toolkit.core.errors import ConfigError

    ctx = context(tmp_path, "algo-1")
    job = ctx.job._replace(framework_params={**ctx.job.framework_params, "sagemaker_mpi_num_processes": 6})
    fixed = ctx._replace(job=job, plan=make_plan(job))
    with pytest.raises(ConfigError, match="sagemaker_mpi_num_processes.*6 processes do not fit 2 host"):
        for_attempt(fixed, Attempt(1, ("algo-1", "algo-3")))


def test_the_ranks_per_host_are_the_first_hosts_where_this_host_names_none():
    from training_toolkit.runners.mpi_launch import job_per_host

    rows = {  # (named, leads, said) -> the lead's count this host takes (None: its own)
        (False, False, "2"): 2,  # an MPIJob worker: the launcher's slots
        (True, False, "2"): None,  # its own hyperparameters name a count: its own
        (False, True, "2"): None,  # the host that leads says the count, it takes none
        (False, False, ""): None,  # a first host that says none (a version before it)
        (False, False, "x"): None, (False, False, "0"): None, (False, False, "99999"): None,
    }
    assert {row: job_per_host(*row) for row in rows} == rows


def test_a_host_that_takes_the_jobs_ranks_per_host_shows_them_to_its_ranks_as_the_lead_does(tmp_path):
    """An MPIJob worker's hyperparameters name no count (the launcher's hostfile has the slots): once it takes the
    lead's, mpirun's count and every framework parameter its ranks read are the lead's ranks' (``with_job_per_host``)."""
    from training_toolkit.runners.mpi_launch import mpi_options, with_job_per_host

    worker = context(tmp_path, "algo-2", {k: v for k, v in HPS.items() if k != "sagemaker_mpi_num_of_processes_per_host"})
    assert "sagemaker_mpi_num_of_processes_per_host" not in json.loads(worker.script_env["SM_FRAMEWORK_PARAMS"])
    assert with_job_per_host(worker, None) is worker
    for per_host in (1, 4):  # its own count (one per host, with no GPU) or not: the key is there either way
        taken = with_job_per_host(worker, per_host)
        params = json.loads(taken.script_env["SM_FRAMEWORK_PARAMS"])
        assert params == {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": per_host}
        training_env = json.loads(taken.script_env["SM_TRAINING_ENV"])
        assert training_env["additional_framework_parameters"] == params
        assert mpi_options(taken).processes_per_host == per_host and mpi_options(taken).num_processes == 4 * per_host
        assert taken.script_env["SM_HOSTS"] == worker.script_env["SM_HOSTS"]
