"""An attempt is one value (``job/attempt.py``), and what a rank sees is computed from (job, attempt) (``runspec.for_attempt``)."""

from __future__ import annotations

import json
from pathlib import Path

from training_toolkit.job.attempt import Attempt, seated
from training_toolkit.job.contract import script_environment
from training_toolkit.core.hardware import Hardware
from training_toolkit.job.spec import build_job
from training_toolkit.core.paths import Paths
from training_toolkit.job.plan import make_plan
from training_toolkit.runspec import RunContext, for_attempt
from training_toolkit.config.settings import parse

HOSTS = ["algo-1", "algo-2", "algo-3", "algo-4"]


def context(current="algo-3", hps=None):
    job = build_job(Paths(Path("/opt/ml")), {**(hps or {}), "sagemaker_mpi_enabled": True},
                    {"current_host": current, "hosts": HOSTS}, {}, {}, Hardware(2, 0, 0))
    return RunContext(job, make_plan(job), parse({}), {}, script_environment(job, {}), ("python", "t.py"),
                      Path("/opt/ml/code"), "python")


def test_the_lead_is_rank_orders_first_and_the_spares_are_the_jobs_other_hosts():
    attempt = seated(2, HOSTS, ("algo-2", "algo-4", "algo-3"))
    assert attempt == Attempt(2, ("algo-2", "algo-4", "algo-3"), ("algo-1",))
    assert attempt.lead == "algo-2" and attempt.leads("algo-2") and not attempt.leads("algo-1")
    assert attempt.runs_on("algo-3") and not attempt.runs_on("algo-1")
    assert seated(0, HOSTS) == Attempt(0, tuple(HOSTS))  # before any barrier: every host, the first the lead


def test_what_a_rank_sees_follows_the_attempt_not_the_platforms_order():
    ctx = context()
    run = for_attempt(ctx, Attempt(1, ("algo-2", "algo-3", "algo-4"), ()))
    env = run.script_env
    assert json.loads(env["SM_HOSTS"]) == ["algo-2", "algo-3", "algo-4"]
    training = json.loads(env["SM_TRAINING_ENV"])
    assert training["master_hostname"] == "algo-2" and training["is_master"] is False
    assert json.loads(env["SM_RESOURCE_CONFIG"])["hosts"] == ["algo-2", "algo-3", "algo-4"]
    assert run.plan.hosts == ("algo-2", "algo-3", "algo-4") and run.plan.lead == "algo-2"
    assert run.plan.options.num_processes == 3  # fitted: one slot per host left
    assert run.job.hyperparameters is ctx.job.hyperparameters  # the job itself is not parsed again
    assert ctx.job.resource.hosts == tuple(HOSTS)  # and the job's own view is unchanged


def test_an_attempt_on_every_host_is_the_job_as_it_is():
    ctx = context()
    assert for_attempt(ctx, seated(3, HOSTS)) is ctx
