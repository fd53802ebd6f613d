"""deploy/kubernetes/: every manifest validated offline, as far as schemas can be had here.

Core kinds (the ConfigMap, and every pod template and JobSet Job template, wrapped as the core
Pod / batch Job they become) against kubernetes-validate's schemas, strictly (unknown fields
fail).  The operators' own fields (TFJob, PyTorchJob, MPIJob, JobSet) have no schema on PyPI:
they are checked here against what the adapter needs, and were not validated against the
operators' CRDs (docs/kubernetes.md).
"""

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
VERSION = "1.30.0"
pytestmark = [pytest.mark.kubernetes_validate]


def manifest(name):
    return yaml.safe_load((DEPLOY / name).read_text())


def validate(doc):
    import kubernetes_validate

    kubernetes_validate.validate(doc, VERSION, strict=True)


def pod_templates(doc):
    spec = doc["spec"]
    if doc["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    replicas = {"TFJob": "tfReplicaSpecs", "PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}[doc["kind"]]
    return [r["template"] for r in spec[replicas].values()]


def test_the_configmap_is_a_valid_core_object():
    validate(manifest("hyperparameters.yaml"))


@pytest.mark.parametrize("name", ["tfjob.yaml", "pytorchjob.yaml", "mpijob.yaml", "jobset.yaml"])
def test_every_pod_template_is_a_valid_pod_running_train_with_its_view_mounted(name):
    doc = manifest(name)
    for template in pod_templates(doc):
        validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": template["spec"]})
        spec = template["spec"]
        (container,) = spec["containers"]
        assert container["command"] == ["train"] and container["image"].startswith("training-toolkit:")
        grace = {e["name"]: e.get("value") for e in container["env"]}["TRAINING_TOOLKIT_GRACE_PERIOD"]
        assert float(grace) < spec["terminationGracePeriodSeconds"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/opt/ml", "/etc/training-toolkit", "/opt/ml/checkpoints"} <= mounts


def test_operator_fields_the_adapter_relies_on():
    mpi = manifest("mpijob.yaml")
    assert mpi["apiVersion"] == "kubeflow.org/v2beta1" and mpi["spec"]["runLauncherAsWorker"] is True
    assert mpi["spec"]["sshAuthMountPath"] == "/root/.ssh"
    tf = manifest("tfjob.yaml")["spec"]["tfReplicaSpecs"]
    assert set(tf) == {"Chief", "Worker"}  # no PS, no Evaluator
    assert all(r["restartPolicy"] == "Never" for r in tf.values())
    torch = manifest("pytorchjob.yaml")
    assert set(torch["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"} and torch["spec"]["nprocPerNode"] == "2"
    js = manifest("jobset.yaml")
    job = js["spec"]["replicatedJobs"][0]
    validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": job["template"]["spec"]})
    env = {e["name"]: e for e in job["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    spec = job["template"]["spec"]
    assert env["TRAINING_TOOLKIT_JOBSET_SHAPE"]["value"] == f"{job['name']}:{job['replicas']}:{spec['parallelism']}"
    assert env["JOBSET_RESTART_ATTEMPT"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"
