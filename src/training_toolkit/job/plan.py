"""LaunchPlan: which runner, and this host's part in it.  A pure decision from the JobSpec.

Every framework parameter a runner reads is checked here, once, before
anything starts: a bad value is a ``ConfigError`` (exit 78) before the control
channel opens, not after sshd and the barrier.  Each runner's options are one
typed tuple (``MpiOptions``...), so a runner reads fields, never dict keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Union

from training_toolkit.core import names
from training_toolkit.job.contract import participating_hosts
from training_toolkit.core.errors import ConfigError
from training_toolkit.job.spec import JobSpec
from training_toolkit.job.mpi_options import CustomMpiOptions, parse_custom_options
from training_toolkit.core.names import MPI, MULTI_WORKER_MIRRORED, PARAMETER_SERVER, SINGLE, TORCH_DISTRIBUTED


class NoOptions(NamedTuple):
    """The single runner takes none."""


class MpiOptions(NamedTuple):
    processes_per_host: int
    num_processes: int  # at most processes_per_host x hosts (the attempt's: ``for_hosts``)
    custom: CustomMpiOptions  # sagemaker_mpi_custom_mpi_options, split: mpirun's, --NCCL_DEBUG, -x variables
    smddp: bool  # SageMaker's data parallel library (its env, smddprun when installed)
    requested: int | None = None  # sagemaker_mpi_num_processes as given (None: one per slot of every host)


class ParameterServerOptions(NamedTuple):
    naming: str  # "chief" or "master" (estimator era)
    num_ps: int | None  # None: one per host
    worker_port: int
    ps_port: int


class MultiWorkerMirroredOptions(NamedTuple):
    port: int


class TorchDistributedOptions(NamedTuple):
    processes_per_host: int
    master_port: int


RunnerOptions = Union[NoOptions, MpiOptions, ParameterServerOptions, MultiWorkerMirroredOptions, TorchDistributedOptions]


class LaunchPlan(NamedTuple):
    runner: str
    hosts: tuple[str, ...]  # the hosts taking part, in rank order: contract.participating_hosts, or this host alone
    current_host: str
    options: RunnerOptions = NoOptions()

    @property
    def lead(self) -> str:
        """The lead of the hosts taking part (rank order's first): the job's master (``contract.master_host``) for the
        first attempt, each attempt's lead for its own (``runspec.for_attempt``): every runner's coordinator."""
        return self.hosts[0]

    @property
    def is_lead(self) -> bool:
        return self.current_host == self.lead

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1


def flag(value: Any, source: str, key: str) -> bool:
    """Switches arrive as JSON booleans, or as strings from hand-written files."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(source, key, f"expected true or false, got {value!r}")


def positive_int(value: Any, source: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit() or int(value) < 1:
        raise ConfigError(source, key, f"expected a positive integer, got {value!r}")
    return int(value)


def make_plan(job: JobSpec) -> LaunchPlan:
    source = str(job.paths.hyperparameters_file)
    chosen = sorted({d.runner for d in names.DISTRIBUTIONS
                     if d.runner and flag(job.framework_params.get(d.switch, False), source, d.switch)})
    if len(chosen) > 1:
        raise ConfigError(source, None, f"more than one distribution is switched on: {', '.join(chosen)}")
    runner = chosen[0] if chosen else SINGLE
    hosts = participating_hosts(job)
    current = job.resource.current_host
    if runner == PARAMETER_SERVER and len(job.resource.hosts) == 1:
        runner = SINGLE  # as the reference: parameter servers only across hosts
    if runner != SINGLE and current not in hosts:
        runner = SINGLE  # a host outside the distribution groups trains on its own
        hosts = (current,)
    if runner == SINGLE:
        return LaunchPlan(SINGLE, (current,), current)
    options: RunnerOptions
    if runner == MPI:
        options = _mpi_options(job, source)
    elif runner == PARAMETER_SERVER:
        options = _ps_options(job, source)
    elif runner == MULTI_WORKER_MIRRORED:
        options = MultiWorkerMirroredOptions(_port(job.framework_params, names.MWMS_PORT_KEY,
                                                   names.TF_MWMS_PORT, source))
    else:
        assert runner == TORCH_DISTRIBUTED, runner
        options = _torch_options(job, source)
    return LaunchPlan(runner, hosts, current, _fit(options, len(hosts), source))


def for_hosts(plan: LaunchPlan, hosts: tuple[str, ...], source: str) -> LaunchPlan:
    """``plan`` for an attempt's active hosts (rank order): the options parsed once, fitted to the hosts' count.

    ``source`` names the hyperparameters file for a count that no longer fits (an explicit
    ``sagemaker_mpi_num_processes`` or ``num_ps`` above what the hosts left can take).
    """
    if tuple(hosts) == plan.hosts:
        return plan
    return plan._replace(hosts=tuple(hosts), options=_fit(plan.options, len(hosts), source))


def with_processes_per_host(plan: LaunchPlan, per_host: int, source: str) -> LaunchPlan:
    """``plan`` (MPI's) with ``per_host`` processes on each host, fitted to its hosts: the job's count where this
    host's own hyperparameters name none (an MPIJob worker's: the slots are in the launcher's hostfile alone)."""
    options = plan.options
    assert isinstance(options, MpiOptions), options
    if options.processes_per_host == per_host:
        return plan
    return plan._replace(options=_fit(options._replace(processes_per_host=per_host), len(plan.hosts), source))


def _fit(options: RunnerOptions, host_count: int, source: str) -> RunnerOptions:
    """The options' counts for ``host_count`` hosts, each checked here once (the job's hosts and every attempt's)."""
    if isinstance(options, MpiOptions):
        slots = options.processes_per_host * host_count
        total = slots if options.requested is None else options.requested
        if total > slots:
            raise ConfigError(source, "sagemaker_mpi_num_processes",
                              f"{total} processes do not fit {host_count} host(s) x {options.processes_per_host} slots")
        return options._replace(num_processes=total)
    if isinstance(options, ParameterServerOptions) and options.num_ps is not None and options.num_ps > host_count:
        raise ConfigError(source, "sagemaker_parameter_server_num_ps",
                          f"{options.num_ps} parameter servers for {host_count} hosts")
    return options


def _port(params: Mapping[str, Any], key: str, default: int, source: str) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigError(source, key, f"expected a port number, got {value!r}")
    return value


def _ps_options(job: JobSpec, source: str) -> ParameterServerOptions:
    params = job.framework_params
    naming = params.get(names.PS_NAMING_KEY, "chief")
    if naming not in ("chief", "master"):
        raise ConfigError(source, names.PS_NAMING_KEY, f"expected \"chief\" or \"master\", got {naming!r}")
    num_ps = params.get("sagemaker_parameter_server_num_ps")
    if num_ps is not None:
        num_ps = positive_int(num_ps, source, "sagemaker_parameter_server_num_ps")
    worker_port = _port(params, names.PS_WORKER_PORT_KEY, names.TF_WORKER_PORT, source)
    ps_port = _port(params, "sagemaker_parameter_server_port", names.TF_PS_PORT, source)
    if worker_port == ps_port:
        raise ConfigError(source, "sagemaker_parameter_server_port", "must differ from the worker port")
    return ParameterServerOptions(naming, num_ps, worker_port, ps_port)


def _torch_options(job: JobSpec, source: str) -> TorchDistributedOptions:
    params = job.framework_params
    key = names.TORCH_PROCESSES_PER_HOST
    per_host = params.get(key)
    per_host = positive_int(per_host, source, key) if per_host is not None else max(1, job.hardware.num_gpus)
    return TorchDistributedOptions(per_host, _port(params, names.TORCH_MASTER_PORT_KEY,
                                                   names.TORCH_MASTER_PORT, source))


def _mpi_options(job: JobSpec, source: str) -> MpiOptions:
    params = job.framework_params
    smddp_switch = names.distribution("smddp").switch
    smddp = flag(params.get(smddp_switch, False), source, smddp_switch)
    per_host_key = names.MPI_PROCESSES_PER_HOST
    per_host = params.get(per_host_key)
    per_host = positive_int(per_host, source, per_host_key) if per_host is not None else max(1, job.hardware.num_gpus)
    total_key = "sagemaker_mpi_num_processes"
    total = params.get(total_key)
    total = positive_int(total, source, total_key) if total is not None else None
    key = "sagemaker_mpi_custom_mpi_options"
    if smddp and not params.get(key):
        key = "sagemaker_distributed_dataparallel_custom_mpi_options"
    return MpiOptions(per_host, 0, parse_custom_options(params.get(key, ""), source, key), smddp, total)
