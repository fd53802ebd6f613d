"""The same image and script under each Kubernetes operator, simulated on local namespace clusters.

No Kubernetes cluster runs here: each pod is a host of a local cluster that gets exactly the
variables, volumes (modes and symlink layout included), /etc/hosts, resolver and DNS records
its operator gives it (helpers/kubernetes.py, from the facts docs/kubernetes.md records),
and runs the toolkit's real ``train`` with no ``/opt/ml`` view of its own.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from helpers import kubernetes as k8s
from helpers.multihost import hps, rank_files, source_dir

pytestmark = [pytest.mark.root]
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2", "TRAINING_TOOLKIT_DNS_TIMEOUT": "30"}


def run_pods(pods, tmp_path, hyperparameters, env=None, **kw):
    return k8s.run(pods, tmp_path, hyperparameters, env={**FAST, **(env or {})}, **kw)


def log(tmp_path, pod):
    return k8s.termination_log(tmp_path / "cluster", pod.name)


def verdict(tmp_path, pod):
    return k8s.termination_verdict(tmp_path / "cluster", pod.name)


SINGLE = {
    "tfjob": (lambda: k8s.tfjob("tfj", "ns1", {"Worker": 1}), "tfj-worker-0"),  # one replica: no TF_CONFIG
    "pytorchjob": (lambda: k8s.pytorchjob("ptj", "ns1", workers=0, nproc=1), "ptj-master-0"),
    "jobset": (lambda: k8s.jobset("js", "ns1", [("workers", 1, 1)]), "js-workers-0-0.js"),
    "job": (lambda: k8s.indexed_job("idx", "ns1", 1, subdomain=None), "idx-0"),
    "pod": (lambda: [k8s.Pod("plain-pod", "ns1")], "plain-pod"),
}


@pytest.mark.parametrize("operator", sorted(SINGLE))
def test_a_single_process_job_sees_the_view_the_platform_built(operator, tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.csv").write_text("1,2\n")
    make, expected_host = SINGLE[operator]
    pods = make()
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src, epochs=3), channels={"train": data})
    assert [r.exit_code for r in results] == [0], [r.failure for r in results]
    info = rank_files(results)[0]
    assert (info["current_host"], info["hosts"]) == (expected_host, [expected_host])
    assert info["args"] == ["--epochs", "3"] and info["hps"] == {"epochs": 3}
    assert info["channel"] == ["part-0.csv"] and info["checkpoints"]
    assert verdict(tmp_path, pods[0]) == "training completed (exit code 0)\n"


def test_a_tfjob_whose_container_is_not_named_tensorflow_is_refused_by_name(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.tfjob("tfj", "ns1", {"Worker": 2}, container="trainer")  # the operator gives neither pod TF_CONFIG
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src), timeout_s=60)
    assert [r.exit_code for r in results] == [0, 78], [r.failure for r in results]  # worker 0 alone cannot tell
    assert "only in the container named 'tensorflow'" in log(tmp_path, pods[1])


@pytest.mark.tensorflow
def test_tfjob_parameter_server_strategy_keeps_each_task_type_and_index(tmp_path):
    src = source_dir(tmp_path, "ps_train.py")
    pods = k8s.tfjob("tfj", "ns1", {"Chief": 1, "Worker": 2})
    results = run_pods(pods, tmp_path, hps("ps_train.py", src), timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    chief = json.loads((results[0].model_dir / "chief.json").read_text())
    assert chief["last_loss"] < chief["first_loss"] / 10
    config = json.loads((results[0].model_dir / "tf_config-chief-0.json").read_text())
    names = ["tfj-chief-0.ns1.svc", "tfj-worker-0.ns1.svc", "tfj-worker-1.ns1.svc"]
    assert config["cluster"] == {"chief": [f"{names[0]}:2222"], "worker": [f"{n}:2222" for n in names[1:]],
                                 "ps": [f"{n}:2223" for n in names]}
    assert json.loads((results[2].model_dir / "tf_config-worker-1.json").read_text())["task"] == {"type": "worker", "index": 1}
    assert all(log(tmp_path, p).startswith("training completed") for p in pods)


@pytest.mark.horovod
@pytest.mark.mpi
@pytest.mark.sshd
def test_mpijob_horovod_runs_from_the_launcher_and_the_worker_has_only_its_role(tmp_path):
    src = source_dir(tmp_path, "horovod_tf_train.py")
    pods = k8s.mpijob("mpj", "ns1", workers=1, slots=2)
    assert pods[1].env == {"K_MPI_JOB_ROLE": "worker"} and "/etc/mpi" not in pods[1].volumes
    results = run_pods(pods, tmp_path, hps("horovod_tf_train.py", src), timeout_s=300)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["size"] == 4 and info["host"] == pods[rank // 2].name for rank, info in ranks.items())
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1
    worker_view = json.loads((results[1].opt_ml / "input/config/resourceconfig.json").read_text())
    assert worker_view["hosts"] == ["mpj-launcher.mpj.ns1.svc", "mpj-worker-0.mpj.ns1.svc"]
    assert all(verdict(tmp_path, p) == "training completed (exit code 0)\n" for p in pods)


@pytest.mark.torch
@pytest.mark.mpi
@pytest.mark.sshd
@pytest.mark.timeout(240)
def test_mpijob_with_two_workers_runs_every_rank_with_the_launchers_membership(tmp_path):
    """Issue 24, item 0: a worker knows only its role; the job's hosts reach it from the launcher, never a guess.

    Before, each worker took the job to be [launcher, itself]: its shim closed the other worker's BTL
    connections and the ranks hung until the timeout.  The ranks per host are the launcher's slots (its hostfile),
    and every rank reads them among the framework parameters, a worker's too (issue 35: only the launcher's did).
    """
    src = source_dir(tmp_path, "mpi_membership.py")
    pods = k8s.mpijob("mpj", "ns1", workers=2, slots=2)
    assert all(p.env == {"K_MPI_JOB_ROLE": "worker"} and "/etc/mpi" not in p.volumes for p in pods[1:])
    results = run_pods(pods, tmp_path, hps("mpi_membership.py", src), timeout_s=150)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == list(range(6))
    hosts = [f"{p.name}.mpj.ns1.svc" for p in pods]
    allowed = {info["netshim_allow"] for info in ranks.values()}
    assert len(allowed) == 1 and len(allowed.pop().split(",")) == 3  # every host admits the same three addresses
    for rank, info in ranks.items():
        assert info["host"] == pods[rank // 2].name and info["size"] == 6 and info["sum"] == 21
        assert info["names"] == [p.name for p in pods for _ in range(2)]
        assert info["sm_current_host"] == hosts[rank // 2]
        assert info["sm_hosts"] == info["training_env_hosts"] == info["resource_config_hosts"] == hosts
        assert info["file_hosts"] == hosts
        assert info["framework_params"]["sagemaker_mpi_num_of_processes_per_host"] == 2, (rank, info)
    for result, host in zip(results, hosts):
        resource = json.loads((result.opt_ml / "input/config/resourceconfig.json").read_text())
        assert resource["hosts"] == hosts and resource["current_host"] == host
    assert all(verdict(tmp_path, p) == "training completed (exit code 0)\n" for p in pods)


@pytest.mark.parametrize("etc_mode", ["overlay", "copy"])
def test_pytorchjob_ddp_across_master_and_worker(etc_mode, tmp_path):
    """``copy``: each pod's /etc a copy bound in place, as the simulation does inside a container (no overlay there)."""
    src = source_dir(tmp_path, "torch_ddp_train.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=1, nproc=2)
    assert pods[0].env["WORLD_SIZE"] == "4"  # pods x nprocPerNode, as the operator sets it
    results = run_pods(pods, tmp_path, hps("torch_ddp_train.py", src), timeout_s=240, etc_mode=etc_mode)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["world"] == 4 and info["host"] == pods[rank // 2].name for rank, info in ranks.items())
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1


@pytest.mark.torch
def test_pytorchjob_nproc_per_node_auto_is_this_pods_cpus_without_a_gpu(tmp_path):
    src = source_dir(tmp_path, "torch_ddp_train.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=0)  # nprocPerNode defaults to "auto"
    results = run_pods(pods, tmp_path, hps("torch_ddp_train.py", src), timeout_s=240)
    assert [r.exit_code for r in results] == [0], [r.failure for r in results]
    assert sorted(rank_files(results)) == list(range(os.cpu_count() or 1))


@pytest.mark.torch
def test_jobset_ddp_chooses_its_distribution_by_hyperparameters(tmp_path):
    src = source_dir(tmp_path, "torch_ddp_train.py")
    pods = k8s.jobset("js", "ns1", [("workers", 1, 2)])
    results = run_pods(pods, tmp_path, hps("torch_ddp_train.py", src, sagemaker_torch_distributed_enabled=True,
                                           sagemaker_distributed_processes_per_host=1), timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1] and all(info["world"] == 2 for info in ranks.values())
    resource = json.loads((results[1].opt_ml / "input/config/resourceconfig.json").read_text())
    assert resource == {"current_host": "js-workers-0-1.js", "hosts": ["js-workers-0-0.js", "js-workers-0-1.js"],
                        "network_interface_name": "eth0"}


@pytest.mark.mpi
@pytest.mark.sshd
def test_jobset_mpi_runs_with_the_names_only_the_subdomain_resolves(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    pods = k8s.jobset("jsm", "ns1", [("workers", 1, 2)], subdomain="net")
    results = run_pods(pods, tmp_path, hps("mpi_allreduce.py", src, sagemaker_mpi_enabled=True,
                                           sagemaker_mpi_num_of_processes_per_host=1), timeout_s=180)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1] and {info["sum"] for info in ranks.values()} == {3}
    assert {info["hostname"] for info in ranks.values()} == {p.name for p in pods}


@pytest.mark.mpi
@pytest.mark.openmpi5
@pytest.mark.sshd
def test_jobset_mpi_under_open_mpi_5_keeps_the_names_whole_too(tmp_path):
    from helpers.paths import OMPI5_BIN, TOOLKIT_PYTHON

    src = tmp_path / "src"
    src.mkdir()
    (src / "ranks").write_text(f"""#!{TOOLKIT_PYTHON}
import json, os, socket
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{{rank}}.json"), "w") as f:
    json.dump({{"rank": rank, "hostname": socket.gethostname()}}, f)
""")
    (src / "ranks").chmod(0o755)
    pods = k8s.jobset("jsm", "ns1", [("workers", 1, 2)], subdomain="net")
    results = run_pods(pods, tmp_path, hps("ranks", src, sagemaker_mpi_enabled=True,
                                           sagemaker_mpi_num_of_processes_per_host=1),
                       env={"PATH": f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"}, timeout_s=180)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    assert {i["hostname"] for i in rank_files(results).values()} == {p.name for p in pods}


@pytest.mark.torch
def test_a_failing_rank_ends_every_pod_with_its_cause_in_the_termination_log(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=1, nproc=1)
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src), env={"FAIL_ON_HOST": "ptj-worker-0"}, timeout_s=120)
    assert all(r.exit_code not in (0, None) for r in results), [(r.exit_code, r.failure) for r in results]
    for pod in pods:
        message = log(tmp_path, pod)
        assert "ptj-worker-0" in message and "\n" == message[-1] and len(message.encode()) <= 4096, message


def test_a_pod_whose_name_never_resolves_is_named_within_the_dns_timeout(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.jobset("js", "ns1", [("workers", 1, 3)])
    pods[2].scheduled = False  # never scheduled: never started, no DNS record
    started = time.monotonic()
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src), env={"TRAINING_TOOLKIT_DNS_TIMEOUT": "3"}, timeout_s=60)
    assert time.monotonic() - started < 45
    assert [r.exit_code for r in results] == [69, 69]
    never = ("pod name(s) js-workers-0-2.js did not resolve within 3 s (pod not scheduled or not running, or its "
             "headless service missing)\n")
    messages = [log(tmp_path, pod) for pod in pods[:2]]
    assert never in messages  # the first to give up names the pod that never came; the other, maybe, that one
    assert all(m == never or m.startswith(f"pod(s) {other}.js ended while this pod waited")
               for m, other in zip(messages, ["js-workers-0-1", "js-workers-0-0"])), messages


def test_a_peer_that_ends_while_a_pod_waits_for_names_ends_the_wait_with_its_name(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.jobset("js", "ns1", [("workers", 1, 3)])
    pods[2].scheduled = False
    pods[1].env["TRAINING_TOOLKIT_DNS_TIMEOUT"] = "3"  # this one gives up first; pod 0 would wait 60 s
    started = time.monotonic()
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src), env={"TRAINING_TOOLKIT_DNS_TIMEOUT": "60"},
                       timeout_s=90)
    assert [r.exit_code for r in results] == [69, 69]
    assert time.monotonic() - started < 40  # not pod 0's 60 s
    assert log(tmp_path, pods[0]).startswith("pod(s) js-workers-0-1.js ended while this pod waited for its peers")


def test_sigterm_gives_the_script_its_grace_within_the_pods_termination_grace_period(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.jobset("js", "ns1", [("workers", 1, 2)])
    ended = {}

    def kubelet_stops_the_pods(procs):  # as the kubelet does on delete or preemption: SIGTERM to every container
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                (tmp_path / "cluster" / p.name / "opt/ml/model/waiting").exists() for p in pods):
            time.sleep(0.1)
        ended["sent"] = time.monotonic()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)  # to train itself, as the kubelet signals a container's PID 1

    results = run_pods(pods, tmp_path, hps("k8s_view.py", src, sagemaker_torch_distributed_enabled=False),
                       env={"WAIT_FOR_SIGTERM": "1"}, timeout_s=90, on_start=kubelet_stops_the_pods)
    assert all(r.exit_code not in (0, None) for r in results), [(r.exit_code, r.failure) for r in results]
    assert max(r.ended_at for r in results) - ended["sent"] < 30  # terminationGracePeriodSeconds' default
    for r, pod in zip(results, pods):
        assert json.loads((r.opt_ml / "checkpoints/saved.json").read_text())["signal"] == signal.SIGTERM
        assert verdict(tmp_path, pod) == "k8s_view.py exited with code 143\n"

