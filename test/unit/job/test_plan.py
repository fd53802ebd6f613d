from pathlib import Path

import pytest

from training_toolkit.job.contract import master_host, training_env
from training_toolkit.core.errors import ConfigError
from training_toolkit.core.hardware import Hardware
from training_toolkit.job.spec import build_job
from training_toolkit.job.mpi_options import CustomMpiOptions
from training_toolkit.core.paths import Paths
from training_toolkit.core.names import DISTRIBUTIONS
from training_toolkit.job.plan import (MpiOptions, MultiWorkerMirroredOptions, NoOptions, ParameterServerOptions,
                                   TorchDistributedOptions, make_plan)

RC2 = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}


def job(hps=None, rc=None, gpus=0):
    return build_job(Paths(Path("/opt/ml")), hps or {}, rc or RC2, {}, {}, Hardware(4, gpus, 0))


def plan(hps=None, rc=None, gpus=0):
    return make_plan(job(hps, rc, gpus))


def test_single_by_default():
    p = plan()
    assert (p.runner, p.hosts, p.current_host) == ("single", ("algo-2",), "algo-2")


def test_parameter_server_needs_several_hosts_as_the_reference():
    assert plan({"sagemaker_parameter_server_enabled": "true"}).runner == "parameter_server"
    one = {"current_host": "algo-1", "hosts": ["algo-1"]}
    assert plan({"sagemaker_parameter_server_enabled": "true"}, one).runner == "single"


@pytest.mark.parametrize("key, runner", [
    ("sagemaker_mpi_enabled", "mpi"),
    ("sagemaker_multi_worker_mirrored_strategy_enabled", "multi_worker_mirrored"),
    ("sagemaker_distributed_dataparallel_enabled", "mpi"),
    ("sagemaker_torch_distributed_enabled", "torch_distributed"),
    ("sagemaker_pytorch_ddp_enabled", "torch_distributed"),
])
def test_switches(key, runner):
    p = plan({key: "true"})
    assert p.runner == runner and p.hosts == ("algo-1", "algo-2") and not p.is_lead and p.hosts.index(p.current_host) == 1


def test_mpi_processes_default_to_gpus_else_one():
    assert plan({"sagemaker_mpi_enabled": "true"}).options.processes_per_host == 1
    p = plan({"sagemaker_mpi_enabled": "true"}, gpus=4)
    assert p.options == MpiOptions(4, 8, CustomMpiOptions(), False)
    p = plan({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "3",
              "sagemaker_mpi_num_processes": "5", "sagemaker_mpi_custom_mpi_options": '"-x FOO"'})
    assert p.options == MpiOptions(3, 5, CustomMpiOptions(rank_variables=(("FOO", None),)), False, requested=5)


def test_the_data_parallel_library_goes_through_mpi_with_its_own_options():
    p = plan({"sagemaker_distributed_dataparallel_enabled": "true",
              "sagemaker_distributed_dataparallel_custom_mpi_options": '"-x A=1"'}, gpus=8)
    assert p.runner == "mpi"
    assert p.options == MpiOptions(8, 16, CustomMpiOptions(rank_variables=(("A", "1"),)), True)


def test_the_library_switch_is_read_as_a_switch():
    p = plan({"sagemaker_mpi_enabled": "true", "sagemaker_distributed_dataparallel_enabled": '"false"'})
    assert (p.runner, p.options.smddp) == ("mpi", False)
    with pytest.raises(ConfigError, match="sagemaker_distributed_dataparallel_enabled: expected true or false"):
        plan({"sagemaker_mpi_enabled": "true", "sagemaker_distributed_dataparallel_enabled": '"yes"'})


def test_a_switch_without_a_runner_here_trains_on_each_host():
    assert plan({"sagemaker_pytorch_xla_multi_worker_enabled": "true"}).runner == "single"


@pytest.mark.parametrize("distribution", [d for d in DISTRIBUTIONS if d.runner])
def test_every_distribution_of_the_table_chooses_its_runner(distribution):
    p = plan({distribution.switch: "true"})
    assert p.runner == distribution.runner
    if distribution.processes_per_host:
        assert plan({distribution.switch: "true", distribution.processes_per_host: "3"}).options.processes_per_host == 3


def test_parameter_server_options():
    p = plan({"sagemaker_parameter_server_enabled": "true"})
    assert p.options == ParameterServerOptions("chief", None, 2222, 2223)
    p = plan({"sagemaker_parameter_server_enabled": "true", "sagemaker_parameter_server_naming": '"master"',
              "sagemaker_parameter_server_num_ps": "1", "sagemaker_parameter_server_port": "3000"})
    assert p.options == ParameterServerOptions("master", 1, 2222, 3000)


def test_custom_mpi_options_are_split_safely():
    p = plan({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_custom_mpi_options": '"-x A=\'b c\' --mca x 1; rm -rf /"'})
    assert p.options.custom.mpirun_args == ("--mca", "x", "1;", "rm", "-rf", "/")
    assert p.options.custom.rank_variables == (("A", "b c"),)


def test_single_takes_no_options():
    assert plan({}).options == NoOptions() and plan({}).options._asdict() == {}


def test_torch_and_mwms_options():
    assert plan({"sagemaker_torch_distributed_enabled": "true"}, gpus=4).options == TorchDistributedOptions(4, 29500)
    assert plan({"sagemaker_pytorch_ddp_enabled": "true", "sagemaker_distributed_processes_per_host": "2"}).options == TorchDistributedOptions(2, 29500)
    assert plan({"sagemaker_multi_worker_mirrored_strategy_enabled": "true"}).options == MultiWorkerMirroredOptions(8890)


@pytest.mark.parametrize("hps, match", [
    ({"sagemaker_mpi_enabled": "true", "sagemaker_parameter_server_enabled": "true"}, "more than one"),
    ({"sagemaker_mpi_enabled": '"yes"'}, "sagemaker_mpi_enabled: expected true or false"),
    ({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "0"}, "positive integer"),
    ({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_processes": '"-1"'}, "positive integer"),
    ({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_custom_mpi_options": "[1]"}, "expected a string"),
    # checked here, before anything starts (once only after sshd and the barrier, on the first host)
    ({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_custom_mpi_options": '"-x \'unbalanced"'},
     "sagemaker_mpi_custom_mpi_options: cannot be parsed: No closing quotation"),
    ({"sagemaker_distributed_dataparallel_enabled": "true",
      "sagemaker_distributed_dataparallel_custom_mpi_options": '"-x \'unbalanced"'},
     "sagemaker_distributed_dataparallel_custom_mpi_options: cannot be parsed"),
    ({"sagemaker_distributed_dataparallel_enabled": "true", "sagemaker_distributed_dataparallel_custom_mpi_options": "3"},
     "sagemaker_distributed_dataparallel_custom_mpi_options: expected a string"),
    ({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2", "sagemaker_mpi_num_processes": "5"},
     "sagemaker_mpi_num_processes: 5 processes do not fit 2 host\\(s\\) x 2 slots"),
    ({"sagemaker_torch_distributed_enabled": "true", "sagemaker_distributed_processes_per_host": "0"}, "positive integer"),
    ({"sagemaker_torch_distributed_enabled": "true", "sagemaker_distributed_master_port": "true"}, "port number"),
    ({"sagemaker_parameter_server_enabled": "true", "sagemaker_parameter_server_naming": '"boss"'}, "chief"),
    ({"sagemaker_parameter_server_enabled": "true", "sagemaker_parameter_server_num_ps": "3"}, "2 hosts"),
    ({"sagemaker_parameter_server_enabled": "true", "sagemaker_parameter_server_port": "2222"}, "must differ"),
    ({"sagemaker_parameter_server_enabled": "true", "sagemaker_parameter_server_port": "70000"}, "port number"),
    ({"sagemaker_multi_worker_mirrored_strategy_enabled": "true", "sagemaker_multi_worker_mirrored_strategy_port": '"x"'}, "port number"),
])
def test_bad_distribution_settings(hps, match):
    with pytest.raises(ConfigError, match=match):
        plan(hps)


def test_host_outside_distribution_groups_runs_alone():
    rc = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "current_group_name": "b",
          "instance_groups": [{"instance_group_name": "a", "instance_type": "t", "hosts": ["algo-1"]},
                              {"instance_group_name": "b", "instance_type": "t", "hosts": ["algo-2"]}]}
    p = plan({"sagemaker_mpi_enabled": "true", "sagemaker_distribution_instance_groups": '["a"]'}, rc)
    assert p.runner == "single"


def test_heterogeneous_groups_choose_the_hosts_that_take_part():
    from training_toolkit.runners.tf_config import PsLayout

    rc = {"current_host": "algo-3", "hosts": ["algo-1", "algo-2", "algo-3", "algo-4"], "current_group_name": "train",
          "instance_groups": [{"instance_group_name": "data", "instance_type": "c5", "hosts": ["algo-1"]},
                              {"instance_group_name": "train", "instance_type": "p3", "hosts": ["algo-4", "algo-2", "algo-3"]}]}
    p = plan({"sagemaker_parameter_server_enabled": "true", "sagemaker_distribution_instance_groups": '["train"]'}, rc)
    assert (p.runner, p.hosts, p.is_lead, p.hosts.index(p.current_host)) == ("parameter_server", ("algo-4", "algo-2", "algo-3"), False, 2)
    assert PsLayout(p.hosts).script_config("algo-3")["task"] == {"type": "worker", "index": 1}
    assert PsLayout(p.hosts).cluster()["chief"] == ["algo-4:2222"]
    p = plan({"sagemaker_mpi_enabled": "true", "sagemaker_distribution_instance_groups": '["train"]'}, rc, gpus=8)
    assert p.hosts == ("algo-4", "algo-2", "algo-3") and p.options.num_processes == 24
    rc_data = {**rc, "current_host": "algo-1", "current_group_name": "data"}
    assert plan({"sagemaker_mpi_enabled": "true", "sagemaker_distribution_instance_groups": '["train"]'}, rc_data).runner == "single"


def test_the_master_is_one_host_for_the_contract_the_plan_and_the_ranks():
    rc = {"current_host": "algo-3", "hosts": ["algo-1", "algo-2", "algo-3"], "current_group_name": "train",
          "instance_groups": [{"instance_group_name": "data", "instance_type": "c5", "hosts": ["algo-1"]},
                              {"instance_group_name": "train", "instance_type": "p3", "hosts": ["algo-3", "algo-2"]}]}
    spec = job({"sagemaker_mpi_enabled": "true"}, rc)
    env = training_env(spec, {})
    assert master_host(spec) == make_plan(spec).lead == env["master_hostname"] == "algo-3"
    assert env["is_master"] is make_plan(spec).is_lead is True
    assert master_host(job()) == make_plan(job({"sagemaker_mpi_enabled": "true"})).lead == "algo-1"


RC4 = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-3", "algo-4"]}


def test_an_attempts_plan_fits_the_options_parsed_once_to_its_hosts():
    from training_toolkit.job.plan import for_hosts

    p = plan({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2",
              "sagemaker_mpi_custom_mpi_options": '"-x FOO"'}, RC4)
    shrunk = for_hosts(p, ("algo-2", "algo-4"), "hp.json")
    assert shrunk.hosts == ("algo-2", "algo-4") and shrunk.lead == "algo-2" and shrunk.is_lead
    assert shrunk.options == p.options._replace(num_processes=4)  # one per slot of the hosts left, custom kept
    assert for_hosts(p, p.hosts, "hp.json") is p


def test_the_jobs_ranks_per_host_where_this_hosts_own_differ_fitted_to_its_hosts():
    from training_toolkit.job.plan import with_processes_per_host

    p = plan({"sagemaker_mpi_enabled": "true"}, RC4)  # an MPIJob worker's: one per host, its own guess
    assert with_processes_per_host(p, 1, "hp.json") is p
    job = with_processes_per_host(p, 2, "hp.json")
    assert job.options == p.options._replace(processes_per_host=2, num_processes=8) and job.hosts == p.hosts
    fixed = plan({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_processes": "6",
                  "sagemaker_mpi_num_of_processes_per_host": "2"}, RC4)
    with pytest.raises(ConfigError, match="hp.json.*6 processes do not fit 4 host"):
        with_processes_per_host(fixed, 1, "hp.json")


@pytest.mark.parametrize("hps, key", [
    ({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_processes": "4"}, "sagemaker_mpi_num_processes"),
    ({"sagemaker_parameter_server_enabled": "true", "sagemaker_parameter_server_num_ps": "3"},
     "sagemaker_parameter_server_num_ps"),
])
def test_an_attempt_on_too_few_hosts_for_an_explicit_count_is_refused_naming_it(hps, key):
    from training_toolkit.job.plan import for_hosts

    p = plan(hps, RC4)
    with pytest.raises(ConfigError, match=f"hp.json.*{key}"):
        for_hosts(p, ("algo-1", "algo-2"), "hp.json")
