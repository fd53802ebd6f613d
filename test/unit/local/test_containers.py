"""The container launcher's pure parts: specs against exact values, artifacts as the SDK leaves them, output prefixing."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from pathlib import Path

from training_toolkit.local import artifacts
from training_toolkit.local.containers import (
    CODE_DIR, LABEL_HOST, LABEL_JOB, LABEL_LAUNCHER, ContainerJob, container_job, host_names, new_job_id,
)
from training_toolkit.local.job import HostResult, LocalJob, host_tree, job_exit_code, lost_hosts, resource_config, summary_lines
from training_toolkit.local.prefix import LinePrefixer


def _job(**kw) -> LocalJob:
    return LocalJob(hosts=("algo-1", "algo-2"), hyperparameters={"sagemaker_program": '"train.py"'}, **kw)


def test_host_names_plain_and_with_a_suffix():
    assert host_names(3) == ("algo-1", "algo-2", "algo-3")
    assert host_names(2, "x7k2q") == ("algo-1-x7k2q", "algo-2-x7k2q")


def test_everything_of_a_job_names_its_launcher_when_given():
    spec = container_job(_job(), image="i", workdir=Path("/w"), source=Path("/s"), job_id="tt-1", secret=None,
                         grace_s=1, launcher="boot:4026531836:42:1000")
    assert spec.network_kwargs()["labels"] == {LABEL_JOB: "tt-1", LABEL_LAUNCHER: "boot:4026531836:42:1000"}
    assert all(c.create_kwargs()["labels"][LABEL_LAUNCHER] == "boot:4026531836:42:1000" for c in spec.containers)


def test_job_ids_are_fresh():
    ids = {new_job_id() for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("tt-") and len(i) == 11 for i in ids)


def test_the_create_arguments_of_each_host_exactly(tmp_path):
    job = _job(channels={"train": Path("/data/train")}, env={"A": "1"}, host_env={"algo-2": {"B": "2"}})
    spec = container_job(job, image="img:cpu", workdir=Path("/w"), source=Path("/src"), job_id="tt-0123abcd",
                         secret="s3cr3t", grace_s=10)
    assert isinstance(spec, ContainerJob)
    assert spec.network_kwargs() == {"name": "tt-0123abcd", "driver": "bridge",
                                     "labels": {LABEL_JOB: "tt-0123abcd"}, "check_duplicate": True}
    first, second = (c.create_kwargs() for c in spec.containers)
    assert first == {
        "image": "img:cpu",
        "name": "algo-1",
        "hostname": "algo-1",
        "entrypoint": ["train"],
        "command": [],
        "environment": {"TRAINING_TOOLKIT_GRACE_PERIOD": "10", "A": "1", "TRAINING_TOOLKIT_JOB_SECRET": "s3cr3t"},
        "labels": {LABEL_JOB: "tt-0123abcd", LABEL_HOST: "algo-1"},
        "mounts": [
            {"Type": "bind", "Source": "/w/algo-1/opt/ml", "Target": "/opt/ml", "ReadOnly": False},
            {"Type": "bind", "Source": "/src", "Target": CODE_DIR, "ReadOnly": True},
            {"Type": "bind", "Source": "/data/train", "Target": "/opt/ml/input/data/train", "ReadOnly": True},
        ],
        "network": "tt-0123abcd",
        "shm_size": "1g",
        "stop_signal": "SIGTERM",
        "detach": True,
    }
    assert second["name"] == second["hostname"] == "algo-2"
    assert second["environment"]["B"] == "2" and second["mounts"][0]["Source"] == "/w/algo-2/opt/ml"


def test_gpus_are_a_device_request_for_every_gpu():
    spec = container_job(_job(), image="i", workdir=Path("/w"), source=Path("/s"), job_id="tt-1", secret=None,
                         grace_s=2.5, gpus=True)
    kwargs = spec.containers[0].create_kwargs()
    assert kwargs["device_requests"] == [{"count": -1, "capabilities": [["gpu"]]}]
    assert "TRAINING_TOOLKIT_JOB_SECRET" not in kwargs["environment"]  # no platform secret: admission by address
    assert kwargs["environment"]["TRAINING_TOOLKIT_GRACE_PERIOD"] == "2.5"
    assert "device_requests" not in container_job(_job(), image="i", workdir=Path("/w"), source=Path("/s"),
                                                  job_id="tt-1", secret=None, grace_s=1).containers[0].create_kwargs()


def test_a_job_command_replaces_train():
    spec = container_job(_job(train=("sleep", "60")), image="i", workdir=Path("/w"), source=Path("/s"),
                         job_id="tt-1", secret=None, grace_s=1)
    assert spec.containers[0].create_kwargs()["entrypoint"] == ["sleep", "60"]


def test_the_host_tree_for_containers_mounts_channels_rather_than_copying(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.csv").write_text("1\n")
    opt_ml = tmp_path / "algo-1" / "opt" / "ml"
    host_tree(opt_ml, _job(channels={"train": data}), "algo-1", copy_channels=False)
    assert (opt_ml / "input" / "data" / "train").is_dir() and not (opt_ml / "input" / "data" / "train" / "x.csv").exists()
    config = opt_ml / "input" / "config"
    assert json.loads((config / "resourceconfig.json").read_text()) == {
        "current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}
    assert json.loads((config / "inputdataconfig.json").read_text()) == {
        "train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}}
    assert all((opt_ml / d).is_dir() for d in ("model", "output/data", "code"))


def test_resourceconfig_without_an_interface_name_as_the_sdk_writes_it():
    assert resource_config(_job(), "algo-2", interface=None) == {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}


def test_artifacts_merge_every_host_and_tar_the_top_level_entries(tmp_path):
    trees = []
    for host, text in (("algo-1", "one"), ("algo-2", "two")):
        opt_ml = tmp_path / host / "opt" / "ml"
        (opt_ml / "model").mkdir(parents=True)
        (opt_ml / "output" / "data").mkdir(parents=True)
        (opt_ml / "model" / f"{host}.txt").write_text(text)
        (opt_ml / "model" / "shared.txt").write_text(text)
        (opt_ml / "output" / "success").write_text("")
        trees.append(opt_ml)
    model_tar, output_tar = artifacts.collect(trees, tmp_path)
    assert model_tar == tmp_path / "model.tar.gz" and output_tar == tmp_path / "output.tar.gz"
    with tarfile.open(model_tar) as tar:
        assert sorted(tar.getnames()) == ["algo-1.txt", "algo-2.txt", "shared.txt"]
        assert tar.extractfile("shared.txt").read() == b"two"  # a later host's file replaces an earlier one's
    with tarfile.open(output_tar) as tar:
        assert sorted(tar.getnames()) == ["data", "success"]
    assert (tmp_path / "artifacts" / "model" / "algo-1.txt").read_text() == "one"


def test_lines_are_prefixed_whole_and_a_last_partial_line_is_ended():
    sink = io.BytesIO()
    p = LinePrefixer(sink, b"[algo-1] ", threading.Lock())
    for chunk in (b"he", b"llo\nwor", b"ld\n\npart"):
        p.feed(chunk)
    assert sink.getvalue() == b"[algo-1] hello\n[algo-1] world\n[algo-1] \n"
    p.close()
    assert sink.getvalue().endswith(b"[algo-1] part\n")


def test_the_job_exit_code_is_the_verdict_of_the_hosts_that_gave_one(tmp_path):
    def r(code, host="h", verdict=True):
        return HostResult(host, code, code == 0 and verdict, None if code == 0 or not verdict else "why", tmp_path, None)
    assert job_exit_code([r(0), r(0)]) == 0
    assert job_exit_code([r(7), r(7)]) == 7
    assert job_exit_code([r(7), r(0)]) == 1  # no majority
    assert job_exit_code([r(0), r(None)]) == 1  # a host did not end
    killed = r(-9, "algo-1", verdict=False)  # killed whole: no verdict file
    assert lost_hosts([killed, r(0, "algo-2")]) == ["algo-1"]
    assert job_exit_code([killed, r(0, "algo-2"), r(0, "algo-3")]) == 0  # the job succeeded without it
    assert job_exit_code([r(203, "algo-1"), r(0, "algo-2"), r(0, "algo-3")]) == 0  # a cut-off lead ends alone
    assert job_exit_code([killed]) == 1  # nobody gave a verdict


def test_the_summary_names_the_hosts_lost_on_the_way_then_each_hosts_end(tmp_path):
    killed = HostResult("algo-1", -9, False, None, tmp_path, None)  # killed whole: no verdict file
    cut_off = HostResult("algo-2", 203, False, "algo-2: no majority to lead the job: 1 of its 3\nmore", tmp_path, None)
    done = HostResult("algo-3", 0, True, None, tmp_path, None)
    running = HostResult("algo-4", None, False, None, tmp_path, None)
    assert summary_lines([killed, cut_off, done, running]) == [
        "  lost on the way (no verdict): algo-1",
        "  algo-1: exit -9: no verdict",
        "  algo-2: exit 203: algo-2: no majority to lead the job: 1 of its 3",
        "  algo-3: exit 0: success",
        "  algo-4: did not end: no verdict"]
    assert summary_lines([done]) == ["  algo-3: exit 0: success"]
