"""Names exist once: the distribution table drives plan and `local`; the docs' tables are the code's."""

import json
import re
from pathlib import Path

import pytest

from training_toolkit import runners

from training_toolkit.core import names
from training_toolkit.core.hardware import Hardware
from training_toolkit.job.spec import build_job
from training_toolkit.local.cli import DISTRIBUTIONS, build_parser, job_hyperparameters
from training_toolkit.core.paths import Paths
from training_toolkit.job.plan import make_plan
from training_toolkit.config.settings import VARIABLES

REPO = Path(__file__).resolve().parents[3]
RC = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]}


def planned(hps: dict[str, str]):
    return make_plan(build_job(Paths(Path("/opt/ml")), hps, RC, {}, {}, Hardware(2, 0, 0)))


def test_local_offers_every_distribution_with_a_runner():
    assert list(DISTRIBUTIONS) == ["mpi", "parameter_server", "multi_worker_mirrored", "smddp", "torch_distributed",
                                   "pytorch_ddp"]


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_a_local_distribution_runs_the_runner_train_chooses_for_it(name):
    hps = job_hyperparameters("train.py", Path("/src"), name, None)
    assert planned(hps).runner == DISTRIBUTIONS[name].runner


def test_local_job_hyperparameters_exactly():
    assert job_hyperparameters("t.py", Path("/s"), "none", None) == \
        {"sagemaker_program": '"t.py"', "sagemaker_submit_directory": '"/s"'}
    assert job_hyperparameters("t.py", Path("/s"), "smddp", 2) == \
        {"sagemaker_program": '"t.py"', "sagemaker_submit_directory": '"/s"',
         "sagemaker_distributed_dataparallel_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2"}
    assert job_hyperparameters("t.py", Path("/s"), "torch_distributed", 3) == \
        {"sagemaker_program": '"t.py"', "sagemaker_submit_directory": '"/s"',
         "sagemaker_torch_distributed_enabled": "true", "sagemaker_distributed_processes_per_host": "3"}


@pytest.mark.parametrize("name", ["mpi", "smddp", "torch_distributed", "pytorch_ddp"])
def test_processes_per_host_reach_every_runner_that_has_them(name):
    plan = planned(job_hyperparameters("train.py", Path("/src"), name, 3))
    assert plan.options.processes_per_host == 3


@pytest.mark.parametrize("name, message", [
    ("none", "--processes-per-host needs a --distribution"),
    ("parameter_server", "--processes-per-host does not apply to parameter_server (one process per host)"),
    ("multi_worker_mirrored", "--processes-per-host does not apply to multi_worker_mirrored (one process per host)"),
])
def test_processes_per_host_where_they_mean_nothing_are_refused(name, message):
    with pytest.raises(ValueError) as caught:
        job_hyperparameters("train.py", Path("/src"), name, 2)
    assert str(caught.value) == message


def test_dataparallel_is_no_distribution_name():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--source", ".", "--entry-point", "x.py", "--distribution", "dataparallel"])


@pytest.mark.parametrize("name", names.RUNNERS)
def test_every_runner_name_is_in_the_runner_table_with_its_interface(name):
    assert tuple(runners.RUNNERS) == names.RUNNERS
    module = runners.runner(name)
    assert module.__name__ == f"training_toolkit.runners.{name}"
    assert callable(module.spec) and callable(module.describe)
    assert {d.runner for d in names.DISTRIBUTIONS} - {None} <= set(names.RUNNERS)


def test_an_unknown_runner_is_named():
    with pytest.raises(ValueError, match="no runner called 'nope'"):
        runners.runner("nope")


def test_the_docs_runner_table_is_the_distribution_table():
    lines = (REPO / "docs" / "multihost.md").read_text().splitlines()
    start = lines.index("| runner | switch (`local --distribution`) | what each host does | the job ends when |")
    rows = [line.split(" | ") for line in lines[start + 2:] if line.startswith("|")][:len(names.RUNNERS) - 1]
    documented = {(row[0].strip("| `"), switch, name) for row in rows
                  for switch, name in re.findall(r"`(sagemaker_\w+)` \(`(\w+)`", row[1])}
    assert documented == {(d.runner, d.switch, d.name) for d in names.DISTRIBUTIONS if d.runner}


def test_the_docs_port_table_is_the_port_table():
    text = (REPO / "docs" / "multihost.md").read_text()
    rows = "\n".join(f"| {p.port} | {p.use} | {p.changed_by} |" for p in names.PORTS)
    assert "| port | for | changed by |\n| --- | --- | --- |\n" + rows + "\n" in text
    settings_ports = {var.name: var.default for var in VARIABLES if var.name.endswith("_PORT")}
    assert settings_ports == {p.changed_by.strip("`"): p.port for p in names.PORTS if "TRAINING_TOOLKIT_" in p.changed_by}


def test_the_docs_list_the_reserved_hyperparameters():
    text = (REPO / "docs" / "contract.md").read_text()
    bullet = text[text.index("- **reserved hyperparameters**"):text.index("Other `sagemaker_*`")]
    assert tuple(re.findall(r"`([a-z0-9_]+)`", bullet)) == names.RESERVED_HYPERPARAMETERS


def test_local_writes_reserved_names_as_the_job_reads_them():
    hps = job_hyperparameters("t.py", Path("/s"), "none", None)
    spec = build_job(Paths(Path("/opt/ml")), hps, RC, {}, {}, Hardware(1, 0, 0))
    assert (spec.entry_point, spec.submit_directory, dict(spec.hyperparameters)) == ("t.py", "/s", {})
    assert json.loads(hps[names.PROGRAM]) == "t.py"
