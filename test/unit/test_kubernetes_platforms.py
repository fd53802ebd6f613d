"""Each operator's facts to the job's view: pure functions, exact values."""

import json

import pytest

from training_toolkit.cluster.ssh import keys
from training_toolkit.errors import ConfigError
from training_toolkit.paths import Paths
from training_toolkit.platforms import jobset, kubernetes, mpijob, pytorchjob, tfjob
from training_toolkit.platforms.view import PodView

POD = {"KUBERNETES_SERVICE_HOST": "192.0.2.1"}


def tf_config(cluster, kind, index):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"})}


def test_tfjob_chief_and_workers_become_parameter_servers_in_task_order():
    cluster = {"worker": ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"], "chief": ["j-chief-0.ns.svc:2222"]}
    view = tfjob.view(tf_config(cluster, "worker", 1))
    assert view == PodView("tfjob", ("j-chief-0.ns.svc", "j-worker-0.ns.svc", "j-worker-1.ns.svc"), "j-worker-1.ns.svc",
                           {"sagemaker_parameter_server_enabled": True, "sagemaker_parameter_server_worker_port": 2222,
                            "sagemaker_parameter_server_naming": "chief"})


def test_tfjob_workers_alone_are_multi_worker_mirrored_and_one_worker_is_single():
    cluster = {"worker": ["j-worker-0.ns.svc:2345", "j-worker-1.ns.svc:2345"]}
    assert tfjob.view(tf_config(cluster, "worker", 0)).framework_params == {
        "sagemaker_multi_worker_mirrored_strategy_enabled": True, "sagemaker_multi_worker_mirrored_strategy_port": 2345}
    assert tfjob.view(tf_config({"worker": ["j-worker-0.ns.svc:2222"]}, "worker", 0)).framework_params == {}


@pytest.mark.parametrize("cluster, kind, problem", [
    ({"worker": ["a:1"], "ps": ["b:1"]}, "worker", "PS and Evaluator replicas are not supported"),
    ({"worker": ["a:1"]}, "evaluator", "PS and Evaluator replicas are not supported"),
    ({"worker": ["a:1", "b:2"]}, "worker", "expected one port for every replica"),
    ({"worker": ["a"]}, "worker", "expected HOST:PORT"),
    ({"worker": ["a:1"]}, "chief", "'chief' 0 is not in the cluster"),
])
def test_tfjob_refusals_name_the_field(cluster, kind, problem):
    with pytest.raises(ConfigError, match=problem):
        tfjob.view(tf_config(cluster, kind, 0))


def test_pytorchjob_master_then_workers_by_rank():
    env = {"MASTER_ADDR": "p-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
           "PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "4"}
    assert pytorchjob.view(env) == PodView("pytorchjob", ("p-master-0", "p-worker-0", "p-worker-1"), "p-worker-1",
                                           {"sagemaker_distributed_processes_per_host": 4,
                                            "sagemaker_torch_distributed_enabled": True,
                                            "sagemaker_distributed_master_port": 23456})
    old = {"MASTER_ADDR": "p-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "1", "RANK": "0"}  # no PET_*: one pod
    assert pytorchjob.view(old) == PodView("pytorchjob", ("p-master-0",), "p-master-0", {})
    with pytest.raises(ConfigError, match="an elastic range"):
        pytorchjob.view({**env, "PET_NNODES": "1:3"})
    with pytest.raises(ConfigError, match="MASTER_ADDR: expected <job>-master-0"):
        pytorchjob.view({**env, "MASTER_ADDR": "10.0.0.1"})


HOSTFILE = "m-launcher.m.ns.svc slots=2\nm-worker-0.m.ns.svc slots=2\nm-worker-1.m.ns.svc slots=2\n"


def test_mpijob_hostfile_order_with_the_launcher_first():
    view = mpijob.view({"K_MPI_JOB_ROLE": "worker"}, HOSTFILE, "m-worker-1")
    assert view == PodView("mpijob", ("m-launcher.m.ns.svc", "m-worker-0.m.ns.svc", "m-worker-1.m.ns.svc"),
                           "m-worker-1.m.ns.svc",
                           {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})


def test_mpijob_refusals():
    workers_only = "m-worker-0.m.ns.svc slots=1\n"
    with pytest.raises(ConfigError, match="set runLauncherAsWorker: true"):
        mpijob.view({"K_MPI_JOB_ROLE": "launcher"}, workers_only, "m-launcher")
    with pytest.raises(ConfigError, match="missing: mpi-operator mounts its ConfigMap"):
        mpijob.view({"K_MPI_JOB_ROLE": "worker"}, None, "m-worker-0")
    with pytest.raises(ConfigError, match="the same slots on every host"):
        mpijob.parse_hostfile("a slots=1\nb slots=2\n")


def test_mpijob_keys_take_the_mounted_key_and_a_fresh_host_key():
    client = keys.generate_keypair("c")
    host = keys.generate_keypair("h")
    files = mpijob.key_files(client.private, client.public + "\n", host)
    assert sorted(files) == sorted(keys.MOUNTED_FILES)
    assert files["id_ed25519"] == client.private and files["ssh_host_ed25519_key"] == host.private
    assert mpijob.job_secret(client.private) == mpijob.job_secret(client.private + b"\n") != mpijob.job_secret(host.private)


def test_jobset_names_every_pod_by_its_dns_name():
    env = {"JOBSET_NAME": "js", "REPLICATED_JOB_NAME": "workers", "JOB_INDEX": "1", "JOB_COMPLETION_INDEX": "0",
           "JOBSET_RESTART_ATTEMPT": "2", "TRAINING_TOOLKIT_JOBSET_SHAPE": "leader:1:1,workers:2:2"}
    assert jobset.view(env) == PodView("jobset", ("js-leader-0-0.js", "js-workers-0-0.js", "js-workers-0-1.js",
                                                  "js-workers-1-0.js", "js-workers-1-1.js"), "js-workers-1-0.js",
                                       restart_attempt=2)
    assert jobset.view({**env, "JOBSET_SUBDOMAIN": "net"}).hosts[0] == "js-leader-0-0.net"
    with pytest.raises(ConfigError, match="expected NAME:JOBS:PODS"):
        jobset.view({**env, "TRAINING_TOOLKIT_JOBSET_SHAPE": "workers:2"})


def test_detection(tmp_path):
    paths = Paths.at(str(tmp_path))
    assert kubernetes.detect({}, paths) == "sagemaker"
    assert kubernetes.detect({**POD, "K_MPI_JOB_ROLE": "worker", "TF_CONFIG": "{}"}, paths) == "mpijob"
    assert kubernetes.detect({**POD, "TF_CONFIG": "{}"}, paths) == "tfjob"
    assert kubernetes.detect({**POD, "MASTER_ADDR": "a", "WORLD_SIZE": "1", "RANK": "0"}, paths) == "pytorchjob"
    assert kubernetes.detect({**POD, "JOB_COMPLETION_INDEX": "0"}, paths) == "jobset"
    assert kubernetes.detect(POD, paths) == "pod"
    assert kubernetes.detect({}, paths, "tfjob") == "tfjob"
    paths.input_config_dir.mkdir(parents=True)
    paths.resource_config_file.write_text("{}")
    assert kubernetes.detect(POD, paths) == "sagemaker"  # a platform already gave the view
    (tmp_path / kubernetes.RUNS_FILE).write_text("1 attempt=0\n")
    assert kubernetes.detect(POD, paths) == "pod"  # ours, from before this container restarted


def test_hyperparameters_variable_over_file_and_operator_defaults_only_without_a_switch():
    defaults = {"sagemaker_mpi_enabled": True}
    assert kubernetes.hyperparameters({"lr": 0.1, "name": "x"}, {"lr": 0.2}, defaults) == {
        "sagemaker_mpi_enabled": "true", "lr": "0.2", "name": "x"}
    assert kubernetes.hyperparameters({"sagemaker_torch_distributed_enabled": True}, None, defaults) == {
        "sagemaker_torch_distributed_enabled": "true"}


def test_termination_message_is_one_line_first_and_fits_the_kubelets_limit():
    assert kubernetes.termination_message(0, None, 0) == "training completed (exit code 0)"
    assert kubernetes.termination_message(1, "rank 3 on h2 exited with code 1", 2) == \
        "container restart 2: rank 3 on h2 exited with code 1"
    assert len(kubernetes.termination_message(1, "é" * 5000, 0).encode()) <= 4096
