"""The same image and script under each Kubernetes operator, simulated on local namespace clusters.

No Kubernetes cluster runs here: each pod is a host of a local cluster that gets exactly the
variables, mounted files (modes included), DNS names and signals its operator would give
(helpers/kubernetes.py), and runs the toolkit's ``train`` with no ``/opt/ml`` view of its own.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from helpers import kubernetes as k8s
from helpers.multihost import hps, rank_files, run, source_dir

pytestmark = [pytest.mark.root]
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2", "TRAINING_TOOLKIT_DNS_TIMEOUT": "20"}


def run_pods(pods, tmp_path, hyperparameters, timeout_s=180, env=None, channels=None, **kw):
    job, before_start = k8s.job(pods, tmp_path / "cluster", hyperparameters, channels=channels, env={**FAST, **(env or {})})
    return run(job, tmp_path, timeout_s=timeout_s, before_start=before_start, **kw)


def single_process_pods(operator, tmp_path):
    return {"tfjob": lambda: k8s.tfjob("tfj", "ns1", chief=False, workers=1),
            "pytorchjob": lambda: k8s.pytorchjob("ptj", workers=0, nproc=1),
            "jobset": lambda: k8s.jobset("js", "workers", 1, 1),
            "pod": lambda: [k8s.Pod("plain-pod")]}[operator]()


@pytest.mark.parametrize("operator", ["tfjob", "pytorchjob", "jobset", "pod"])
def test_a_single_process_job_sees_the_view_the_adapter_built(operator, tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.csv").write_text("1,2\n")
    pods = single_process_pods(operator, tmp_path)
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src, epochs=3), channels={"train": data})
    assert [r.exit_code for r in results] == [0], [r.failure for r in results]
    info = rank_files(results)[0]
    expected_host = {"tfjob": "tfj-worker-0.ns1.svc", "pytorchjob": "ptj-master-0",
                     "jobset": "js-workers-0-0.js", "pod": "plain-pod"}[operator]
    assert (info["current_host"], info["hosts"]) == (expected_host, [expected_host])
    assert info["args"] == ["--epochs", "3"] and info["hps"] == {"epochs": 3}
    assert info["channel"] == ["part-0.csv"] and info["checkpoints"]
    assert k8s.termination_log(tmp_path / "cluster", pods[0].name) == "training completed (exit code 0)\n"


@pytest.mark.tensorflow
def test_tfjob_parameter_server_strategy_keeps_each_task_type_and_index(tmp_path):
    src = source_dir(tmp_path, "ps_train.py")
    pods = k8s.tfjob("tfj", "ns1", chief=True, workers=2)
    results = run_pods(pods, tmp_path, hps("ps_train.py", src), timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    chief = json.loads((results[0].model_dir / "chief.json").read_text())
    assert chief["last_loss"] < chief["first_loss"] / 10
    config = json.loads((results[0].model_dir / "tf_config-chief-0.json").read_text())
    names = ["tfj-chief-0.ns1.svc", "tfj-worker-0.ns1.svc", "tfj-worker-1.ns1.svc"]
    assert config["cluster"] == {"chief": [f"{names[0]}:2222"], "worker": [f"{n}:2222" for n in names[1:]],
                                 "ps": [f"{n}:2223" for n in names]}
    assert json.loads((results[2].model_dir / "tf_config-worker-1.json").read_text())["task"] == {"type": "worker", "index": 1}
    assert all(k8s.termination_log(tmp_path / "cluster", p.name).startswith("training completed") for p in pods)


@pytest.mark.horovod
@pytest.mark.mpi
@pytest.mark.sshd
def test_mpijob_horovod_runs_from_the_launcher_with_the_mounted_key_at_0644(tmp_path):
    src = source_dir(tmp_path, "horovod_tf_train.py")
    pods = k8s.mpijob("mpj", "ns1", workers=1, slots=2, workdir=tmp_path / "cluster")
    results = run_pods(pods, tmp_path, hps("horovod_tf_train.py", src), timeout_s=300)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["size"] == 4 and info["host"] == pods[rank // 2].name for rank, info in ranks.items())
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1
    key = tmp_path / "cluster" / pods[0].name / "k8s" / "root/.ssh/id_rsa"
    assert oct(key.stat().st_mode & 0o777) == "0o644"  # used as mounted, never chmod-ed


@pytest.mark.torch
def test_pytorchjob_ddp_across_master_and_worker(tmp_path):
    src = source_dir(tmp_path, "torch_ddp_train.py")
    pods = k8s.pytorchjob("ptj", workers=1, nproc=2)
    results = run_pods(pods, tmp_path, hps("torch_ddp_train.py", src), timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["world"] == 4 and info["host"] == pods[rank // 2].name for rank, info in ranks.items())
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1


@pytest.mark.torch
def test_jobset_job_chooses_its_distribution_by_hyperparameters(tmp_path):
    src = source_dir(tmp_path, "torch_ddp_train.py")
    pods = k8s.jobset("js", "workers", jobs=1, pods=2)
    results = run_pods(pods, tmp_path, hps("torch_ddp_train.py", src, sagemaker_torch_distributed_enabled=True,
                                           sagemaker_distributed_processes_per_host=1), timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1] and all(info["world"] == 2 for info in ranks.values())
    resource = json.loads((results[1].opt_ml / "input/config/resourceconfig.json").read_text())
    assert resource == {"current_host": "js-workers-0-1.js", "hosts": ["js-workers-0-0.js", "js-workers-0-1.js"],
                        "network_interface_name": "eth0"}


@pytest.mark.torch
def test_a_failing_rank_ends_every_pod_with_its_cause_in_the_termination_log(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.pytorchjob("ptj", workers=1, nproc=1)
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src), env={"FAIL_ON_HOST": "ptj-worker-0"}, timeout_s=120)
    assert all(r.exit_code not in (0, None) for r in results), [(r.exit_code, r.failure) for r in results]
    for pod in pods:
        message = k8s.termination_log(tmp_path / "cluster", pod.name)
        assert "ptj-worker-0" in message and "\n" == message[-1] and len(message.encode()) <= 4096, message


def test_a_pod_whose_name_never_resolves_is_named_within_the_dns_timeout(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.jobset("js", "workers", jobs=1, pods=3)
    pods[2].resolvable = False  # never scheduled: no DNS record
    started = time.monotonic()
    results = run_pods(pods, tmp_path, hps("k8s_view.py", src), env={"TRAINING_TOOLKIT_DNS_TIMEOUT": "3"}, timeout_s=60)
    assert time.monotonic() - started < 30
    assert [r.exit_code for r in results] == [69, 69]
    for pod in pods[:2]:
        assert k8s.termination_log(tmp_path / "cluster", pod.name) == (
            "pod name(s) js-workers-0-2.js did not resolve within 3 s (pod not scheduled or not running, "
            "or its headless service missing)\n")


def test_sigterm_gives_the_script_its_grace_within_the_pods_termination_grace_period(tmp_path):
    src = source_dir(tmp_path, "k8s_view.py")
    pods = k8s.jobset("js", "workers", jobs=1, pods=2)
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
        assert k8s.termination_log(tmp_path / "cluster", pod.name) == "k8s_view.py exited with code 143\n"
