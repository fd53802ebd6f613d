"""Kubeflow TFJob: the pod's ``TF_CONFIG`` gives the cluster by replica type and this task.

The training-operator writes ``{"cluster": {type: ["<job>-<type>-<i>.<ns>.svc:<port>"]},
"task": {"type", "index"}, "environment": "cloud"}`` (training-operator
``pkg/controller.v1/tensorflow/tensorflow.go``, ``genClusterSpec``), every replica type present
in ``cluster``, into the container named ``tensorflow`` only, and only when the job has more
than one replica.  A pod whose container has another name gets nothing: with
``TRAINING_TOOLKIT_PLATFORM=tfjob`` it is refused by name (``pod.py`` refuses one that merely
looks like a replica).  The hosts are the cluster's names, chief (or master) first, then the
workers by index: the order the toolkit's TensorFlow runners rebuild ``TF_CONFIG`` in, so
every task keeps its type and index.  A chief means parameter servers (the toolkit runs
them on the first hosts, as on SageMaker); workers alone mean MultiWorkerMirroredStrategy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

from training_toolkit.core import names
from training_toolkit.core.errors import ConfigError
from training_toolkit.platforms.kubernetes import PodPlatform, in_a_pod
from training_toolkit.platforms.view import Facts, split_endpoint

VARIABLE = "TF_CONFIG"
CONTAINER = "tensorflow"  # the only container the training-operator gives TF_CONFIG (TFJobDefaultContainerName)
_CHIEFS = ("chief", "master")


class TFJob(PodPlatform):
    name = "tfjob"

    def detected(self, facts: Facts) -> bool:
        return in_a_pod(facts) and bool(facts.environ.get(VARIABLE))

    def hosts_of(self, facts: Facts):
        if not facts.environ.get(VARIABLE):
            raise ConfigError(f"environment variable {VARIABLE}", None,
                              f"missing: the training-operator sets it only in the container named {CONTAINER!r}, "
                              "and only when the job has more than one replica; name the container "
                              f"{CONTAINER!r} (a one-replica job: set TRAINING_TOOLKIT_PLATFORM=pod)")
        hosts, current, params = cluster_of(facts.environ)
        return hosts, current, params, 0


def cluster_of(environ: Mapping[str, str]):
    """(hosts, this host, default hyperparameters) from ``TF_CONFIG``."""
    source = f"environment variable {VARIABLE}"
    try:
        config = json.loads(environ.get(VARIABLE, ""))
    except ValueError as exc:
        raise ConfigError(source, None, f"malformed JSON: {exc}") from None
    cluster, task = (config.get("cluster"), config.get("task")) if isinstance(config, dict) else (None, None)
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ConfigError(source, None, "expected {\"cluster\": {...}, \"task\": {\"type\", \"index\"}}")
    for kind in ("ps", "evaluator"):
        if kind in cluster or task.get("type") == kind:
            raise ConfigError(source, kind, "PS and Evaluator replicas are not supported: declare Chief and Worker "
                              "replicas; the toolkit runs the parameter servers on the first hosts "
                              "(sagemaker_parameter_server_num_ps), see docs/kubernetes.md")
    unknown = sorted(set(cluster) - {*_CHIEFS, "worker"})
    if unknown:
        raise ConfigError(source, "cluster", f"unknown replica type(s) {unknown}")
    chiefs = [c for c in _CHIEFS if c in cluster]
    if len(chiefs) > 1 or any(len(cluster[c]) != 1 for c in chiefs):
        raise ConfigError(source, "cluster", "expected at most one chief (or master) replica")
    ordered: list[tuple[str, int, str]] = []  # (type, index, endpoint)
    for kind in (*chiefs, "worker"):
        entries = cluster.get(kind, [])
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ConfigError(source, f"cluster.{kind}", "expected a list of HOST:PORT")
        ordered += [(kind, i, e) for i, e in enumerate(entries)]
    if not ordered:
        raise ConfigError(source, "cluster", "no chief and no workers")
    endpoints = [split_endpoint(e, source, f"cluster.{k}[{i}]") for k, i, e in ordered]
    hosts = tuple(h for h, _ in endpoints)
    ports = {p for _, p in endpoints}
    if len(ports) != 1:
        raise ConfigError(source, "cluster", f"expected one port for every replica, got {sorted(ports)}")
    port = ports.pop()
    kind, index = task.get("type"), task.get("index")
    matching = [n for n, (k, i, _) in enumerate(ordered) if k == kind and i == index]
    if not matching:
        raise ConfigError(source, "task", f"{kind!r} {index!r} is not in the cluster")
    params: dict = {}
    if chiefs and len(hosts) > 1:
        params = {names.distribution("parameter_server").switch: True,
                  names.PS_WORKER_PORT_KEY: port,
                  names.PS_NAMING_KEY: chiefs[0]}
    elif len(hosts) > 1:
        params = {names.distribution("multi_worker_mirrored").switch: True,
                  names.MWMS_PORT_KEY: port}
    return hosts, hosts[matching[0]], MappingProxyType(params)
