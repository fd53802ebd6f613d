import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_toolkit.job.contract import master_host
from training_toolkit.core.errors import ConfigError
from training_toolkit.core.hardware import Hardware
from training_toolkit.job.spec import build_job, decode_hyperparameter, load_job
from training_toolkit.core.paths import Paths

HW = Hardware(num_cpus=4, num_gpus=0, num_neurons=0)
PATHS = Paths(Path("/opt/ml"))
RC = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]}


def job(hps=None, rc=None, data=None, environ=None):
    return build_job(PATHS, hps or {}, rc or RC, data or {}, environ or {}, HW)


@pytest.mark.parametrize(
    "raw, decoded",
    [("10", 10), ("1.5", 1.5), ("true", True), ('"adam"', "adam"), ("[1, 2]", [1, 2]), ("adam", "adam"),
     ("", ""), ('{"a": 1}', {"a": 1}), ("a b; rm -rf /", "a b; rm -rf /"), (7, 7), ("null", None)],
)
def test_hyperparameters_decode_as_the_reference(raw, decoded):
    assert decode_hyperparameter(raw) == decoded


def test_hyperparameters_split_into_user_framework_and_reserved():
    spec = job({"lr": "0.1", "sagemaker_program": '"train.py"', "sagemaker_mpi_enabled": "true",
                "sagemaker_submit_directory": '"/code"', "_tuning_objective_metric": '"loss"',
                "sagemaker_job_name": '"j1"', "sagemaker_region": '"eu-west-1"'})
    assert dict(spec.hyperparameters) == {"lr": 0.1}
    assert dict(spec.framework_params) == {"sagemaker_mpi_enabled": True}
    assert spec.entry_point == "train.py"
    assert spec.submit_directory == "/code"
    assert spec.job_name == "j1"
    assert spec.region == "eu-west-1"
    assert "_tuning_objective_metric" in spec.reserved


def test_sagemaker_program_variable_wins_over_hyperparameter_as_the_reference():
    spec = job({"sagemaker_program": '"a.py"'}, environ={"SAGEMAKER_PROGRAM": "b.py"})
    assert spec.entry_point == "b.py"


def test_sagemaker_training_module_is_refused_by_name_and_empty_counts_as_unset():
    with pytest.raises(ConfigError) as info:
        job(environ={"SAGEMAKER_TRAINING_MODULE": "sagemaker_tensorflow_container.training:main"})
    assert str(info.value).startswith("environment: SAGEMAKER_TRAINING_MODULE: 'sagemaker_tensorflow_container.training:main': "
                                      "this toolkit runs the entry point itself")
    assert info.value.exit_code == 78
    assert job(environ={"SAGEMAKER_TRAINING_MODULE": ""}).entry_point is None


def test_resource_defaults_and_roles():
    spec = job()
    res = spec.resource
    assert res.network_interface_name == "eth0"
    assert res.current_group_name == "homogeneousCluster"
    assert res.current_instance_type == "local"
    assert res.hosts.index(res.current_host) == 0 and master_host(spec) == "algo-1"


def test_heterogeneous_cluster():
    rc = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-3"], "current_group_name": "cpu",
          "current_instance_type": "ml.c5.xlarge",
          "instance_groups": [{"instance_group_name": "gpu", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-1"]},
                              {"instance_group_name": "cpu", "instance_type": "ml.c5.xlarge", "hosts": ["algo-2", "algo-3"]}]}
    spec = job(rc=rc)
    assert spec.is_hetero
    assert spec.resource.instance_groups[1].hosts == ("algo-2", "algo-3")
    assert [g.name for g in spec.resource.instance_groups] == ["gpu", "cpu"]


@pytest.mark.parametrize(
    "rc, field",
    [
        ({"hosts": ["a"]}, "current_host"),
        ({"current_host": "a", "hosts": []}, "hosts"),
        ({"current_host": "a", "hosts": "a"}, "hosts"),
        ({"current_host": "c", "hosts": ["a", "b"]}, "current_host"),
        ({"current_host": "a", "hosts": ["a", "a"]}, "hosts"),
        ({"current_host": "a", "hosts": ["a", "b;rm"]}, "hosts"),
        ({"current_host": "a", "hosts": ["a", 3]}, "hosts"),
        ({"current_host": "a", "hosts": ["a"], "network_interface_name": "eth0; ls"}, "network_interface_name"),
        ({"current_host": "a", "hosts": ["a"], "instance_groups": {}}, "instance_groups"),
        ({"current_host": "a", "hosts": ["a"], "instance_groups": [{"instance_group_name": "g", "instance_type": "t", "hosts": ["z"]}]}, "instance_groups[0].hosts"),
        ({"current_host": "a", "hosts": ["a"], "current_group_name": "x", "instance_groups": [{"instance_group_name": "g", "instance_type": "t", "hosts": ["a"]}]}, "current_group_name"),
    ],
)
def test_bad_resource_config_names_the_field(rc, field):
    with pytest.raises(ConfigError) as err:
        job(rc=rc)
    assert err.value.field == field
    assert "resourceconfig.json" in str(err.value)


@pytest.mark.parametrize("data", [{"../x": {}}, {"a/b": {}}, {"": {}}, {"train": "File"}])
def test_bad_channels(data):
    with pytest.raises(ConfigError, match="inputdataconfig.json"):
        job(data=data)


def test_bad_framework_values():
    with pytest.raises(ConfigError, match="sagemaker_container_log_level"):
        job({"sagemaker_container_log_level": '"loud"'})
    with pytest.raises(ConfigError, match="sagemaker_program"):
        job({"sagemaker_program": "[1]"})
    with pytest.raises(ConfigError, match="unknown instance group"):
        job({"sagemaker_distribution_instance_groups": '["nope"]'})


def test_files_missing_malformed_or_wrong_type(tmp_path):
    paths = Paths(tmp_path)
    with pytest.raises(ConfigError, match="hyperparameters.json: file is missing"):
        load_job(paths, {}, HW)
    paths.input_config_dir.mkdir(parents=True)
    paths.hyperparameters_file.write_text("{")
    with pytest.raises(ConfigError, match="hyperparameters.json: malformed JSON"):
        load_job(paths, {}, HW)
    paths.hyperparameters_file.write_text("[]")
    with pytest.raises(ConfigError, match="expected a JSON object, got list"):
        load_job(paths, {}, HW)
    paths.hyperparameters_file.write_text("{}")
    with pytest.raises(ConfigError, match="resourceconfig.json: file is missing"):
        load_job(paths, {}, HW)
    paths.resource_config_file.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="resourceconfig.json: cannot be read"):
        load_job(paths, {}, HW)
    paths.resource_config_file.write_text(json.dumps(RC))
    spec = load_job(paths, {}, HW)  # inputdataconfig.json is optional
    assert spec.channels == ()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(hps=st.dictionaries(st.text(max_size=12), json_values | st.text(), max_size=6),
       rc=st.dictionaries(st.sampled_from(["current_host", "hosts", "network_interface_name", "instance_groups",
                                           "current_group_name", "current_instance_type"]), json_values, max_size=6),
       data=st.dictionaries(st.text(max_size=8), json_values, max_size=3))
def test_fuzzed_configs_either_parse_or_raise_config_error(hps, rc, data):
    try:
        spec = job(hps, rc, data)
    except ConfigError as exc:
        assert "\n" not in str(exc), "errors are one line"
        return
    assert spec.resource.current_host in spec.resource.hosts


# The job's hosts as the first host gave them (issue 24: an MPIJob worker knows only the launcher and itself)
WORKER_RC = {"current_host": "w-1", "hosts": ["launcher", "w-1"], "network_interface_name": "eth0"}


@pytest.mark.parametrize("given, hosts", [
    (("launcher", "w-1"), ("launcher", "w-1")),  # the same: the same job, unchanged
    (("launcher", "w-0", "w-1"), ("launcher", "w-0", "w-1")),  # a partial view: the first host's list
    (("w-1", "launcher"), ("w-1", "launcher")),  # another order: the first host's
])
def test_with_hosts_takes_the_first_hosts_list(given, hosts):
    from training_toolkit.job.spec import with_hosts

    spec = job(rc=WORKER_RC)
    taken = with_hosts(spec, given)
    assert taken.resource.hosts == hosts and taken.resource.current_host == "w-1"
    assert dict(taken.resource.raw) == {**WORKER_RC, "hosts": list(hosts)}  # SM_RESOURCE_CONFIG and the file
    assert taken.resource.network_interface_name == "eth0"
    assert (taken is spec) == (given == ("launcher", "w-1"))


@pytest.mark.parametrize("rc, given, field", [
    (WORKER_RC, ("launcher", "w-0"), "current_host"),  # a list without this host
    (WORKER_RC, ("launcher", "w-1", "w-1"), "hosts"),
    ({"current_host": "a", "hosts": ["a", "b"], "current_group_name": "g",
      "instance_groups": [{"instance_group_name": "g", "instance_type": "t", "hosts": ["a", "b"]}]},
     ("a", "b", "c"), "hosts"),  # groups name their hosts: no other list fits them
])
def test_with_hosts_refuses_what_cannot_be_this_hosts_job(rc, given, field):
    from training_toolkit.job.spec import with_hosts

    with pytest.raises(ConfigError) as err:
        with_hosts(job(rc=rc), given)
    assert err.value.field == field
