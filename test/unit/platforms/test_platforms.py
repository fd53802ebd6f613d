"""Each platform's facts to the job's view: pure functions, exact values, through the one seam."""

import json

import pytest

from training_toolkit import platforms

from training_toolkit.config import settings
from training_toolkit.core.errors import ClusterError, ConfigError
from training_toolkit.core.hardware import Hardware
from training_toolkit.core.paths import Paths
from training_toolkit.platforms import kubernetes, mpijob, opt_ml, pytorchjob, tfjob
from training_toolkit.platforms.sagemaker import SageMaker
from training_toolkit.platforms.view import Facts
from training_toolkit.config.settings import KeyFiles

POD = {"KUBERNETES_SERVICE_HOST": "192.0.2.1"}
CPU = Hardware(num_cpus=2, num_gpus=0, num_neurons=0)


def facts(environ, hostname="h", files=None, dirs=(), hardware=CPU, base="/opt/ml"):
    files = dict(files or {})
    return Facts({**POD, **environ}, hostname, files.get, lambda path: tuple(dirs) if path.endswith("/data") else (),
                 Paths.at(base), settings.parse({**POD, **environ}), hardware)


def view_of(environ, **kw):
    f = facts(environ, **kw)
    return platforms.choose(f.settings.platform, f).view(f)


def kubelet_hosts(hostname, subdomain=None, ns="ns"):
    fqdn = f"{hostname}.{subdomain}.{ns}.svc.cluster.local\t" if subdomain else ""
    return {"/etc/hosts": f"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.0.0.5\t{fqdn}{hostname}\n"}


def tf_config(cluster, kind, index):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"})}


def test_tfjob_chief_and_workers_become_parameter_servers_in_task_order():
    cluster = {"worker": ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"], "chief": ["j-chief-0.ns.svc:2222"]}
    view = view_of(tf_config(cluster, "worker", 1), hostname="j-worker-1")
    assert (view.platform, view.hosts, view.current_host) == (
        "tfjob", ("j-chief-0.ns.svc", "j-worker-0.ns.svc", "j-worker-1.ns.svc"), "j-worker-1.ns.svc")
    assert view.hyperparameters == {"sagemaker_parameter_server_enabled": "true",
                                    "sagemaker_parameter_server_worker_port": "2222",
                                    "sagemaker_parameter_server_naming": "chief"}
    assert view.overrides == settings.Overrides(grace_s=25.0, verdict_wait_s=420.0, rejoin_wait_s=0.0)  # a Master made again hears the verdict


def test_tfjob_workers_alone_are_multi_worker_mirrored_and_one_worker_is_single():
    cluster = {"worker": ["j-worker-0.ns.svc:2345", "j-worker-1.ns.svc:2345"]}
    assert tfjob.cluster_of(tf_config(cluster, "worker", 0))[2] == {
        "sagemaker_multi_worker_mirrored_strategy_enabled": True, "sagemaker_multi_worker_mirrored_strategy_port": 2345}
    assert tfjob.cluster_of(tf_config({"worker": ["j-worker-0.ns.svc:2222"]}, "worker", 0))[2] == {}


@pytest.mark.parametrize("cluster, kind, problem", [
    ({"worker": ["a:1"], "ps": ["b:1"]}, "worker", "PS and Evaluator replicas are not supported"),
    ({"worker": ["a:1"]}, "evaluator", "PS and Evaluator replicas are not supported"),
    ({"worker": ["a:1", "b:2"]}, "worker", "expected one port for every replica"),
    ({"worker": ["a"]}, "worker", "expected HOST:PORT"),
    ({"worker": ["a:1"]}, "chief", "'chief' 0 is not in the cluster"),
])
def test_tfjob_refusals_name_the_field(cluster, kind, problem):
    with pytest.raises(ConfigError, match=problem):
        tfjob.cluster_of(tf_config(cluster, kind, 0))


def test_a_tfjob_container_not_named_tensorflow_is_refused_by_name():
    with pytest.raises(ConfigError, match="only in the container named 'tensorflow'"):
        view_of({"TRAINING_TOOLKIT_PLATFORM": "tfjob"}, hostname="j-worker-0")
    with pytest.raises(ConfigError, match="replica worker 1 of what looks like TFJob j: .* named 'tensorflow'"):
        view_of({}, hostname="j-worker-1")  # auto: no operator's facts, but named as a TFJob's second worker
    assert view_of({"TRAINING_TOOLKIT_PLATFORM": "pod"}, hostname="j-worker-1").hosts == ("j-worker-1",)
    assert view_of({}, hostname="j-worker-0").hosts == ("j-worker-0",)  # a one-replica TFJob gets no TF_CONFIG


PTJ = {"MASTER_ADDR": "p-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "12", "RANK": "2", "PET_NNODES": "3",
       "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "4", "PET_MASTER_ADDR": "p-master-0", "PET_MASTER_PORT": "23456",
       "PYTHONUNBUFFERED": "1"}


def test_pytorchjob_master_then_workers_by_node_rank_whatever_world_size_says():
    view = view_of(PTJ, hostname="p-worker-1")
    assert (view.hosts, view.current_host) == (("p-master-0", "p-worker-0", "p-worker-1"), "p-worker-1")
    assert view.hyperparameters == {"sagemaker_distributed_processes_per_host": "4",
                                    "sagemaker_torch_distributed_enabled": "true",
                                    "sagemaker_distributed_master_port": "23456"}
    with pytest.raises(ConfigError, match="an elastic range"):
        pytorchjob.cluster_of({**PTJ, "PET_NNODES": "1:3"}, CPU)
    with pytest.raises(ConfigError, match="MASTER_ADDR: expected <job>-master-0"):
        pytorchjob.cluster_of({**PTJ, "MASTER_ADDR": "10.0.0.1"}, CPU)


@pytest.mark.parametrize("raw, hardware, expected", [
    ("auto", CPU, 2), ("auto", Hardware(8, 4, 0), 4), ("gpu", Hardware(8, 4, 0), 4), ("cpu", Hardware(8, 4, 0), 8),
    ("3", CPU, 3),
])
def test_pytorchjob_nproc_per_node_as_torchrun_reads_it(raw, hardware, expected):
    assert pytorchjob.processes_per_pod(raw, hardware) == expected
    hosts, _, params = pytorchjob.cluster_of({**PTJ, "PET_NPROC_PER_NODE": raw}, hardware)
    assert params["sagemaker_distributed_processes_per_host"] == expected


def test_pytorchjob_nproc_refusals():
    with pytest.raises(ConfigError, match="PET_NPROC_PER_NODE: this pod has no GPU"):
        pytorchjob.processes_per_pod("gpu", CPU)
    with pytest.raises(ConfigError, match="expected a number, auto, gpu or cpu, got 'many'"):
        pytorchjob.processes_per_pod("many", CPU)


HOSTFILE = "m-launcher.m.ns.svc slots=2\nm-worker-0.m.ns.svc slots=2\nm-worker-1.m.ns.svc slots=2\n"
KEY = "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"


def test_mpijob_launcher_reads_the_hostfile_with_itself_first():
    files = {"/etc/mpi/hostfile": HOSTFILE, "/root/.ssh/id_rsa": KEY, **kubelet_hosts("m-launcher", "m")}
    view = view_of({"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile"},
                   hostname="m-launcher", files=files)
    assert (view.platform, view.hosts, view.current_host) == (
        "mpijob", ("m-launcher.m.ns.svc", "m-worker-0.m.ns.svc", "m-worker-1.m.ns.svc"), "m-launcher.m.ns.svc")
    assert view.hyperparameters == {"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2"}
    assert view.overrides == settings.Overrides(25.0, KeyFiles("/root/.ssh", "id_rsa", "id_rsa.pub", None, None),
                                                mpijob.job_secret(KEY.encode()))


def test_mpijob_worker_has_no_hostfile_and_finds_its_launcher_from_its_own_name():
    files = {"/root/.ssh/id_rsa": KEY, **kubelet_hosts("m-worker-1", "m", ns="team")}
    view = view_of({"K_MPI_JOB_ROLE": "worker"}, hostname="m-worker-1", files=files)
    assert (view.hosts, view.current_host) == (("m-launcher.m.team.svc", "m-worker-1.m.team.svc"),
                                               "m-worker-1.m.team.svc")
    assert view.hyperparameters == {"sagemaker_mpi_enabled": "true"}
    assert view.overrides.job_secret == mpijob.job_secret(KEY.encode())


def test_mpijob_refusals():
    with pytest.raises(ConfigError, match="set runLauncherAsWorker: true"):
        mpijob.launcher_view("m-worker-0.m.ns.svc slots=1\n", "m-launcher")
    with pytest.raises(ConfigError, match="the launcher m-launcher must be the first host"):
        mpijob.launcher_view("m-worker-0.m.ns.svc\nm-launcher.m.ns.svc\n", "m-launcher")
    with pytest.raises(ConfigError, match="/etc/mpi/hostfile: missing: mpi-operator mounts its ConfigMap"):
        view_of({"K_MPI_JOB_ROLE": "launcher"}, hostname="m-launcher", files={"/root/.ssh/id_rsa": KEY})
    with pytest.raises(ConfigError, match="/root/.ssh/id_rsa: missing: mpi-operator mounts the job's ssh secret"):
        view_of({"K_MPI_JOB_ROLE": "worker"}, hostname="m-worker-0", files=kubelet_hosts("m-worker-0", "m"))
    own = view_of({"K_MPI_JOB_ROLE": "worker", "TRAINING_TOOLKIT_SSH_KEYS": "/keys"}, hostname="m-worker-0",
                  files=kubelet_hosts("m-worker-0", "m"))  # the job's own keys, in the toolkit's naming
    assert own.overrides == settings.Overrides(grace_s=25.0)
    with pytest.raises(ConfigError, match="the same slots on every host"):
        mpijob.parse_hostfile("a slots=1\nb slots=2\n")
    with pytest.raises(ConfigError, match="/etc/hosts: no line names this pod as m-worker-0.m.<namespace>.svc"):
        mpijob.worker_view("m-worker-0", None, None)


JS = {"JOBSET_NAME": "js", "REPLICATED_JOB_NAME": "workers", "JOB_INDEX": "1", "JOB_COMPLETION_INDEX": "0",
      "JOBSET_RESTART_ATTEMPT": "2", "TRAINING_TOOLKIT_JOBSET_SHAPE": "leader:1:1,workers:2:2"}


def test_jobset_names_every_pod_by_hostname_and_the_subdomain_the_kubelet_wrote():
    view = view_of(JS, hostname="js-workers-1-0", files=kubelet_hosts("js-workers-1-0", "js"))
    assert (view.hosts, view.current_host, view.restart_attempt) == (
        ("js-leader-0-0.js", "js-workers-0-0.js", "js-workers-0-1.js", "js-workers-1-0.js", "js-workers-1-1.js"),
        "js-workers-1-0.js", 2)
    assert view_of(JS, hostname="js-workers-1-0", files=kubelet_hosts("js-workers-1-0", "net")).hosts[0] == \
        "js-leader-0-0.net"
    with pytest.raises(ConfigError, match="expected NAME:JOBS:PODS"):
        view_of({**JS, "TRAINING_TOOLKIT_JOBSET_SHAPE": "workers:2"}, files=kubelet_hosts("h", "js"))
    with pytest.raises(ConfigError, match="/etc/hosts: no line names this pod"):
        view_of(JS, hostname="js-workers-1-0")


def test_a_plain_indexed_job_needs_no_jobset_labels():
    one = view_of({"JOB_COMPLETION_INDEX": "0"}, hostname="train-0")
    assert (one.platform, one.hosts) == ("job", ("train-0",))
    many = view_of({"JOB_COMPLETION_INDEX": "2", "TRAINING_TOOLKIT_COMPLETIONS": "3"}, hostname="train-2",
                   files=kubelet_hosts("train-2", "workers"))
    assert (many.hosts, many.current_host) == (("train-0.workers", "train-1.workers", "train-2.workers"),
                                               "train-2.workers")
    with pytest.raises(ConfigError, match="only with spec.subdomain"):
        view_of({"JOB_COMPLETION_INDEX": "0", "TRAINING_TOOLKIT_COMPLETIONS": "2"}, hostname="train-0")


def test_detection_walks_the_registry(tmp_path):
    base = str(tmp_path)
    f = lambda env, **kw: platforms.choose("auto", facts(env, base=base, **kw)).name  # noqa: E731
    assert platforms.choose("auto", Facts({}, "h", {}.get, lambda p: (), Paths.at(base), settings.parse({}),
                                          CPU)).name == "sagemaker"
    assert f({"K_MPI_JOB_ROLE": "worker", "TF_CONFIG": "{}"}) == "mpijob"
    assert f({"TF_CONFIG": "{}"}) == "tfjob"
    assert f({"MASTER_ADDR": "a", "WORLD_SIZE": "1", "RANK": "0"}) == "pytorchjob"
    assert f({"JOB_COMPLETION_INDEX": "0", "JOBSET_NAME": "js"}) == "jobset"
    assert f({"JOB_COMPLETION_INDEX": "0"}) == "job"
    assert f({}) == "pod"
    resource = {f"{base}/input/config/resourceconfig.json": "{}"}
    assert f({"TF_CONFIG": "{}"}, files=resource) == "sagemaker"  # a platform already gave the view
    assert f({}, files={**resource, f"{base}/{kubernetes.RUNS_FILE}": "1 attempt=0\n"}) == "pod"  # ours, restarted
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_PLATFORM: expected one of auto, mpijob, tfjob"):
        platforms.choose("k8s", facts({}))
    assert [e.name for e in platforms.PLATFORMS] == ["mpijob", "tfjob", "pytorchjob", "jobset", "job", "slurm", "pod",
                                                     "sagemaker"]
    assert [platforms.load(e).name for e in platforms.PLATFORMS] == [e.name for e in platforms.PLATFORMS]


def test_hyperparameters_variable_over_file_and_operator_defaults_only_without_a_switch():
    hp = "/etc/training-toolkit/hyperparameters.json"
    f = facts({"TRAINING_TOOLKIT_HYPERPARAMETERS": '{"lr": 0.2}'}, files={hp: '{"lr": 0.1, "name": "x"}'})
    assert kubernetes.hyperparameters(f, {"sagemaker_mpi_enabled": True}) == {
        "sagemaker_mpi_enabled": "true", "lr": "0.2", "name": "x"}
    f = facts({}, files={hp: '{"sagemaker_torch_distributed_enabled": true}'})
    assert kubernetes.hyperparameters(f, {"sagemaker_mpi_enabled": True}) == {
        "sagemaker_torch_distributed_enabled": "true"}
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_HYPERPARAMETERS: expected a JSON object, got list"):
        kubernetes.hyperparameters(facts({"TRAINING_TOOLKIT_HYPERPARAMETERS": "[1]"}), {})


def test_channels_are_the_volumes_under_input_data():
    view = view_of({}, hostname="p", dirs=("train", "eval"))
    assert view.channels == {name: dict(opt_ml.FILE_CHANNEL) for name in ("train", "eval")}


def test_termination_message_is_one_line_first_and_fits_the_kubelets_limit():
    assert kubernetes.termination_message(0, None, 0) == "training completed (exit code 0)"
    assert kubernetes.termination_message(1, "rank 3 on h2 exited with code 1", 2) == \
        "container restart 2: rank 3 on h2 exited with code 1"
    assert len(kubernetes.termination_message(1, "é" * 5000, 0).encode() + b"\n") <= 4096
    assert kubernetes.termination_message(0, None, 0, "summary: attempts=2 faults=1") == \
        "training completed (exit code 0)\ntraining-toolkit: summary: attempts=2 faults=1"  # the verdict's line first


def test_the_dns_wait_ends_at_once_naming_a_peer_whose_record_vanished():
    answers = {"a": [["10.0.0.1"], ["10.0.0.1"]], "b": [["10.0.0.2"], []]}  # b resolved, then ended
    resolve = lambda host: answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]  # noqa: E731
    answers["c"] = [[], []]
    with pytest.raises(ClusterError, match=r"pod\(s\) b ended while this pod waited for its peers"):
        kubernetes.wait_for_names(("a", "b", "c"), timeout_s=30, poll_s=0.01, resolve=resolve)
    with pytest.raises(ClusterError, match=r"pod name\(s\) c did not resolve within 0.05 s"):
        kubernetes.wait_for_names(("c",), timeout_s=0.05, poll_s=0.01, resolve=lambda host: [])


def test_write_view_lays_out_opt_ml_and_a_given_view_is_left_alone(tmp_path):
    view = view_of({"JOB_COMPLETION_INDEX": "0"}, hostname="train-0", dirs=("train",))
    opt_ml.write_view(Paths(tmp_path), view)
    assert json.loads((tmp_path / "input/config/resourceconfig.json").read_text()) == {
        "current_host": "train-0", "hosts": ["train-0"], "network_interface_name": "eth0"}
    assert json.loads((tmp_path / "input/config/inputdataconfig.json").read_text()) == {"train": opt_ml.FILE_CHANNEL}
    assert all((tmp_path / d).is_dir() for d in opt_ml.DIRECTORIES)
    given = SageMaker().view(Facts({}, "h", {}.get, lambda p: (), Paths(tmp_path / "sm"), settings.parse({}),
                                             CPU))
    opt_ml.write_view(Paths(tmp_path / "sm"), given)
    assert not (tmp_path / "sm").exists()
