"""The one flow from a container's facts to its job: ``run`` and ``plan`` build the same JobSpec, and it writes nothing."""

from training_toolkit import flow

from training_toolkit.job import spec as job
from training_toolkit.platforms.opt_ml import write_view

POD = {"KUBERNETES_SERVICE_HOST": "192.0.2.1", "MASTER_ADDR": "p-master-0", "MASTER_PORT": "23456", "RANK": "1",
       "WORLD_SIZE": "4", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2",
       "TRAINING_TOOLKIT_HYPERPARAMETERS": '{"sagemaker_program": "train.py", "epochs": 3, "note": "a \\"quoted\\"; b"}',
       "TRAINING_TOOLKIT_JOB_SECRET": "s" * 32}


def no_file(path: str) -> None:
    return None


def test_the_job_built_from_the_view_is_the_one_run_would_read_back_from_opt_ml(tmp_path):
    base = tmp_path / "opt_ml"
    environ = {**POD, "SAGEMAKER_BASE_DIR": str(base), "TRAINING_TOOLKIT_HYPERPARAMETERS_FILE": str(tmp_path / "none")}
    begun = flow.start(environ, read=no_file)
    view = flow.view(begun)
    built = flow.job(begun, view)
    assert not base.exists()  # the flow writes nothing
    assert "TRAINING_TOOLKIT_JOB_SECRET" not in built.environ  # the secret left the environment at the start
    assert built.config.job_secret == b"s" * 32
    assert (built.launch.runner, built.spec.resource.hosts) == ("torch_distributed", ("p-master-0", "p-worker-0"))
    write_view(begun.paths, view)  # what run writes, read back as a platform-given /opt/ml would be
    assert job.load_job(begun.paths, built.environ, flow.with_gpus(begun.facts.hardware, built.config)) == built.spec


def test_settings_the_view_overrides_and_the_variables_it_unsets():
    environ = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}
    assert flow.without(environ, ("SLURM_PROCID",)) == {"SLURM_JOB_ID": "7"}
    assert flow.without(environ, ()) == environ and flow.without(environ, ()) is not environ
