"""deploy/kubernetes/: every manifest validated offline, against the operators' own CRDs and the core schemas.

The operators' CRDs, as their projects publish them (test/fixtures/crds, SOURCES.md), validate
each custom resource strictly: a field the schema does not name is refused, as
``kubectl apply --validate=strict`` does, unless the schema preserves unknown fields.  Core kinds
(the ConfigMap, the Service, the plain Job, and every pod template wrapped as the Pod it becomes)
are validated against kubernetes-validate's schemas.  No cluster was used.
"""

import copy
import gzip
import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
CRDS = REPO / "test" / "fixtures" / "crds"
IMAGE_ROOT = "/opt/training-toolkit"  # where Dockerfile.cpu copies the repository (COPY . /opt/training-toolkit)
VERSION = "1.30.0"
CUSTOM = {"tfjob.yaml": "tfjobs", "pytorchjob.yaml": "pytorchjobs", "mpijob.yaml": "mpijobs", "jobset.yaml": "jobsets"}
JOBSET_LABELS = ("jobset-name", "jobset-uid", "replicatedjob-name", "restart-attempt", "replicatedjob-replicas",
                 "global-replicas", "job-index", "job-global-index", "job-key", "group-name", "group-replicas",
                 "job-group-index")  # jobset api/jobset/v1alpha2/jobset_types.go (reference/kubernetes-operators.md)


def documents(name):
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def manifest(name):
    (doc,) = documents(name)
    return doc


def strict(schema):
    """The CRD's schema with unknown fields refused wherever it lists the known ones."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def crd_validator(crd_name, api_version):
    import jsonschema

    crd = yaml.safe_load(gzip.open(CRDS / f"{crd_name}.yaml.gz"))
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    return jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))


def crd_errors(doc, crd_name):
    validator = crd_validator(crd_name, doc["apiVersion"])
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc))


@pytest.mark.parametrize("name", sorted(CUSTOM))
def test_every_custom_resource_is_valid_against_its_operators_crd(name):
    doc = manifest(name)
    assert crd_errors(doc, CUSTOM[name]) == []


def test_the_crd_check_refuses_a_misspelt_field():
    doc = manifest("mpijob.yaml")
    doc["spec"]["runLauncherAsWorkers"] = doc["spec"].pop("runLauncherAsWorker")
    assert crd_errors(doc, "mpijobs") == ["spec: Additional properties are not allowed ('runLauncherAsWorkers' was "
                                          "unexpected)"]
    doc = manifest("jobset.yaml")
    doc["spec"]["replicatedJobs"][0]["replicas"] = "1"
    assert crd_errors(doc, "jobsets") == ["spec.replicatedJobs.0.replicas: '1' is not of type 'integer'"]


def validate_core(doc):
    import kubernetes_validate

    kubernetes_validate.validate(doc, VERSION, strict=True)


def pod_templates(doc):
    spec = doc["spec"]
    if doc["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    if doc["kind"] == "Job":
        return [spec["template"]]
    replicas = {"TFJob": "tfReplicaSpecs", "PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}[doc["kind"]]
    return [r["template"] for r in spec[replicas].values()]


@pytest.mark.kubernetes_validate
def test_the_core_objects_are_valid():
    validate_core(manifest("hyperparameters.yaml"))
    for doc in documents("indexed-job.yaml"):
        validate_core(doc)


def test_the_configmap_names_code_that_is_in_the_image():
    hps = json.loads(manifest("hyperparameters.yaml")["data"]["hyperparameters.json"])
    directory = hps["sagemaker_submit_directory"]
    assert directory.startswith(IMAGE_ROOT + "/")
    in_repo = REPO / directory[len(IMAGE_ROOT) + 1:]
    assert (in_repo / hps["sagemaker_program"]).is_file()
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip()[:1] not in "#"]
    assert not any(directory[len(IMAGE_ROOT) + 1:].startswith(p.rstrip("/")) for p in ignored)


@pytest.mark.kubernetes_validate
@pytest.mark.parametrize("name", [*sorted(CUSTOM), "indexed-job.yaml"])
def test_every_pod_template_is_a_valid_pod_running_train_with_its_view_mounted(name):
    doc = documents(name)[-1]
    for template in pod_templates(doc):
        validate_core({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": template["spec"]})
        spec = template["spec"]
        (container,) = spec["containers"]
        assert container["command"] == ["train"] and container["image"].startswith("training-toolkit:")
        grace = {e["name"]: e.get("value") for e in container["env"]}["TRAINING_TOOLKIT_GRACE_PERIOD"]
        assert float(grace) < spec["terminationGracePeriodSeconds"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/opt/ml", "/etc/training-toolkit", "/opt/ml/checkpoints"} <= mounts


def test_operator_fields_the_platforms_rely_on():
    mpi = manifest("mpijob.yaml")
    assert mpi["spec"]["runLauncherAsWorker"] is True and mpi["spec"]["sshAuthMountPath"] == "/root/.ssh"
    tf = manifest("tfjob.yaml")["spec"]["tfReplicaSpecs"]
    assert set(tf) == {"Chief", "Worker"}  # no PS, no Evaluator
    assert all(c["name"] == "tensorflow" for r in tf.values() for c in r["template"]["spec"]["containers"])
    torch = manifest("pytorchjob.yaml")
    assert set(torch["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}


def test_the_jobset_shape_and_labels_are_the_jobsets_own():
    js = manifest("jobset.yaml")
    shape = []
    for job in js["spec"]["replicatedJobs"]:
        spec = job["template"]["spec"]
        assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
        shape.append(f"{job['name']}:{job['replicas']}:{spec['parallelism']}")
        env = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}
        assert env["TRAINING_TOOLKIT_JOBSET_SHAPE"]["value"] == ",".join(shape)
        for name in ("JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_INDEX", "JOBSET_RESTART_ATTEMPT"):
            path = env[name]["valueFrom"]["fieldRef"]["fieldPath"]
            assert path.startswith("metadata.labels['jobset.sigs.k8s.io/") and path[36:-2] in JOBSET_LABELS, path


def test_the_indexed_job_has_its_headless_service_and_says_its_completions():
    service, job = documents("indexed-job.yaml")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["TRAINING_TOOLKIT_COMPLETIONS"] == str(spec["completions"])
