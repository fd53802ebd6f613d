"""The same image and script under each Kubernetes operator, simulated on local namespace clusters.

No Kubernetes cluster runs here: each pod is a host of a local cluster that gets exactly the
variables, mounted files (modes included), DNS names and signals its operator would give
(helpers/kubernetes.py), and runs the toolkit's ``train`` with no ``/opt/ml`` view of its own.
"""

from __future__ import annotations

import json
import os
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
