"""Horovod (TensorFlow) and the data parallel library's API under the MPI runner, torch DDP under torch_distributed."""

from __future__ import annotations

import json

import pytest

from helpers.multihost import hps, rank_files, run, source_dir
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root]
H2 = ("algo-1", "algo-2")
ENV = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.horovod
@pytest.mark.mpi
@pytest.mark.sshd
def test_horovod_tensorflow_on_2_hosts_x_2(tmp_path):
    src = source_dir(tmp_path, "horovod_tf_train.py")
    job = LocalJob(hosts=H2, env=ENV, hyperparameters=hps("horovod_tf_train.py", src, sagemaker_mpi_enabled=True,
                                                          sagemaker_mpi_num_of_processes_per_host=2))
    results = run(job, tmp_path, timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, info in ranks.items():
        assert (info["size"], info["local_size"], info["local_rank"]) == (4, 2, rank % 2)
        assert info["host"] == H2[rank // 2]
        assert info["last_loss"] < info["first_loss"] / 10
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1


@pytest.mark.torch
def test_torch_ddp_on_2_hosts_x_2(tmp_path, capfd):
    src = source_dir(tmp_path, "torch_ddp_train.py")
    job = LocalJob(hosts=H2, env=ENV, hyperparameters=hps("torch_ddp_train.py", src, sagemaker_torch_distributed_enabled=True,
                                                          sagemaker_distributed_processes_per_host=2))
    results = run(job, tmp_path, timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["world"] == 4 and info["local_rank"] == rank % 2 and info["host"] == H2[rank // 2]
               for rank, info in ranks.items())
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1
    assert all(info["last_loss"] < info["first_loss"] for info in ranks.values())
    assert "left behind" not in capfd.readouterr().out  # every process ended by its owner, the toolkit's own too


@pytest.mark.torch
def test_torch_ddp_on_hosts_with_different_device_counts_ranks_them_as_torchrun(tmp_path):
    """No count in the job: each host runs one process per device it has (1 on algo-1, 2 on algo-2, 1 on algo-3),
    and every process gets the rank torchrun's agents would give it (before, the ranks overlapped and the job hung)."""
    src = source_dir(tmp_path, "torch_ddp_train.py")
    hosts = ("algo-1", "algo-2", "algo-3")
    gpus = {host: {"TRAINING_TOOLKIT_NUM_GPUS": count} for host, count in zip(hosts, ("1", "2", "1"))}
    job = LocalJob(hosts=hosts, env=ENV, host_env=gpus,
                   hyperparameters=hps("torch_ddp_train.py", src, sagemaker_torch_distributed_enabled=True))
    results = run(job, tmp_path, timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert {rank: (info["host"], info["local_rank"], info["world"]) for rank, info in ranks.items()} == {
        0: ("algo-1", 0, 4), 1: ("algo-2", 0, 4), 2: ("algo-2", 1, 4), 3: ("algo-3", 0, 4)}
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1


def test_a_failing_torch_distributed_process_stops_every_host(tmp_path, capfd):
    src = tmp_path / "src"
    src.mkdir()
    (src / "dp.py").write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '3':\n    time.sleep(1); sys.exit('rank 3 gives up')\n"
        "time.sleep(60)\n")
    job = LocalJob(hosts=H2, env=ENV, hyperparameters=hps("dp.py", src, sagemaker_pytorch_ddp_enabled=True,
                                                          sagemaker_distributed_processes_per_host=2))
    results = run(job, tmp_path, timeout_s=60)
    for r in results:
        assert r.exit_code == 1
        assert r.failure.splitlines()[0] == "algo-2 rank 3: dp.py exited with code 1: rank 3 gives up"
    ended = [r.ended_at for r in results]
    assert max(ended) - min(ended) < 3
    assert "left behind" not in capfd.readouterr().out  # the ranks were stopped, not found left over


@pytest.mark.horovod
@pytest.mark.mpi
@pytest.mark.sshd
@pytest.mark.horovod
def test_smddp_style_tensorflow_script_on_2_hosts_x_2_with_our_api(tmp_path):
    """A script written for the data-parallel library, import line changed, launched as the library's jobs are."""
    src = source_dir(tmp_path, "smddp_tf_train.py")
    job = LocalJob(hosts=H2, env=ENV, hyperparameters=hps("smddp_tf_train.py", src,
                                                          sagemaker_distributed_dataparallel_enabled=True,
                                                          sagemaker_mpi_num_of_processes_per_host=2))
    results = run(job, tmp_path, timeout_s=240)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["size"] == 4 and info["local_size"] == 2 and info["host"] == H2[rank // 2]
               for rank, info in ranks.items())
    assert len({json.dumps(info["weights"]) for info in ranks.values()}) == 1


def test_stopping_a_torch_distributed_job_gives_every_process_its_grace(tmp_path):
    """SIGTERM to every host's train (a platform stop): each process saves, and the job is reported stopped."""
    import signal
    import threading
    import time

    src = tmp_path / "src"
    src.mkdir()
    (src / "dp.py").write_text(
        "import os, signal, sys, time\n"
        "def save(*_):\n"
        "    time.sleep(1.5)\n"
        "    open(os.path.join(os.environ['SM_MODEL_DIR'], 'saved-' + os.environ['RANK']), 'w').close()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'up-' + os.environ['RANK']), 'w').close()\n"
        "time.sleep(60)\n")

    def stop_all(procs):
        def later():
            deadline = time.monotonic() + 30
            while len(list((tmp_path / "cluster").glob("algo-*/opt/ml/model/up-*"))) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
        threading.Thread(target=later, daemon=True).start()

    job = LocalJob(hosts=H2, env=ENV, hyperparameters=hps("dp.py", src, sagemaker_pytorch_ddp_enabled=True,
                                                          sagemaker_distributed_processes_per_host=2))
    results = run(job, tmp_path, timeout_s=60, on_start=stop_all)
    assert sorted(p.name for r in results for p in r.model_dir.glob("saved-*")) == [f"saved-{i}" for i in range(4)]
    for r in results:
        assert r.exit_code == 143, (r.host, r.exit_code, r.failure)
        assert "stopped by SIGTERM" in r.failure.splitlines()[0]
