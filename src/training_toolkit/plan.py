"""LaunchPlan: which runner, and this host's part in it.  A pure decision from the JobSpec."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from training_toolkit.errors import ConfigError
from training_toolkit.job import JobSpec

SINGLE = "single"
MPI = "mpi"
PARAMETER_SERVER = "parameter_server"
MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
DATA_PARALLEL = "dataparallel"

# framework parameter -> runner; several switched on at once is an error
SWITCHES = {
    "sagemaker_mpi_enabled": MPI,
    "sagemaker_parameter_server_enabled": PARAMETER_SERVER,
    "sagemaker_multi_worker_mirrored_strategy_enabled": MULTI_WORKER_MIRRORED,
    "sagemaker_distributed_dataparallel_enabled": MPI,  # the library's launcher is mpirun (+ smddprun)
    "sagemaker_torch_distributed_enabled": DATA_PARALLEL,
    "sagemaker_pytorch_ddp_enabled": DATA_PARALLEL,
}


class LaunchPlan(NamedTuple):
    runner: str
    hosts: tuple[str, ...]  # the hosts taking part, in rank order
    current_host: str
    options: Mapping[str, Any] = MappingProxyType({})

    @property
    def is_master(self) -> bool:
        return self.current_host == self.hosts[0]

    @property
    def host_index(self) -> int:
        return self.hosts.index(self.current_host)

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
    chosen = sorted(
        {runner for key, runner in SWITCHES.items() if flag(job.framework_params.get(key, False), source, key)}
    )
    if len(chosen) > 1:
        raise ConfigError(source, None, f"more than one distribution is switched on: {', '.join(chosen)}")
    runner = chosen[0] if chosen else SINGLE
    hosts = _participating_hosts(job)
    current = job.resource.current_host
    if runner == PARAMETER_SERVER and len(job.resource.hosts) == 1:
        runner = SINGLE  # as the reference: parameter servers only across hosts
    if runner != SINGLE and current not in hosts:
        runner = SINGLE  # a host outside the distribution groups trains on its own
        hosts = (current,)
    if runner == SINGLE:
        return LaunchPlan(SINGLE, (current,), current)
    options: dict[str, Any] = {}
    if runner == MPI:
        options = _mpi_options(job, source, len(hosts))
    elif runner == PARAMETER_SERVER:
        options = _ps_options(job, source, len(hosts))
    elif runner == MULTI_WORKER_MIRRORED:
        options = {"port": _port(job.framework_params, "sagemaker_multi_worker_mirrored_strategy_port", 8890, source)}
    elif runner == DATA_PARALLEL:
        options = _dp_options(job, source)
    return LaunchPlan(runner, hosts, current, options)


def _port(params: Mapping[str, Any], key: str, default: int, source: str) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigError(source, key, f"expected a port number, got {value!r}")
    return value


def _ps_options(job: JobSpec, source: str, host_count: int) -> dict[str, Any]:
    params = job.framework_params
    naming = params.get("sagemaker_parameter_server_naming", "chief")
    if naming not in ("chief", "master"):
        raise ConfigError(source, "sagemaker_parameter_server_naming", f"expected \"chief\" or \"master\", got {naming!r}")
    num_ps = params.get("sagemaker_parameter_server_num_ps")
    if num_ps is not None:
        num_ps = positive_int(num_ps, source, "sagemaker_parameter_server_num_ps")
        if num_ps > host_count:
            raise ConfigError(source, "sagemaker_parameter_server_num_ps", f"{num_ps} parameter servers for {host_count} hosts")
    worker_port = _port(params, "sagemaker_parameter_server_worker_port", 2222, source)
    ps_port = _port(params, "sagemaker_parameter_server_port", 2223, source)
    if worker_port == ps_port:
        raise ConfigError(source, "sagemaker_parameter_server_port", "must differ from the worker port")
    return {"naming": naming, "num_ps": num_ps, "worker_port": worker_port, "ps_port": ps_port}


def _dp_options(job: JobSpec, source: str) -> dict[str, Any]:
    params = job.framework_params
    key = "sagemaker_distributed_processes_per_host"
    per_host = params.get(key)
    per_host = positive_int(per_host, source, key) if per_host is not None else max(1, job.hardware.num_gpus)
    return {"processes_per_host": per_host, "master_port": _port(params, "sagemaker_distributed_master_port", 29500, source)}


def _participating_hosts(job: JobSpec) -> tuple[str, ...]:
    from training_toolkit.contract import distribution_hosts

    return tuple(distribution_hosts(job)) or job.resource.hosts


def _mpi_options(job: JobSpec, source: str, host_count: int) -> dict[str, Any]:
    params = job.framework_params
    data_parallel = bool(params.get("sagemaker_distributed_dataparallel_enabled"))
    per_host_key = "sagemaker_mpi_num_of_processes_per_host"
    per_host = params.get(per_host_key)
    per_host = positive_int(per_host, source, per_host_key) if per_host is not None else max(1, job.hardware.num_gpus)
    total_key = "sagemaker_mpi_num_processes"
    total = params.get(total_key)
    total = positive_int(total, source, total_key) if total is not None else per_host * host_count
    custom = params.get("sagemaker_mpi_custom_mpi_options", "")
    if not isinstance(custom, str):
        raise ConfigError(source, "sagemaker_mpi_custom_mpi_options", f"expected a string, got {custom!r}")
    if data_parallel:
        custom = custom or params.get("sagemaker_distributed_dataparallel_custom_mpi_options", "")
        if not isinstance(custom, str):
            raise ConfigError(source, "sagemaker_distributed_dataparallel_custom_mpi_options", f"expected a string, got {custom!r}")
    return {"processes_per_host": per_host, "num_processes": total, "custom_mpi_options": custom,
            "data_parallel": data_parallel}
