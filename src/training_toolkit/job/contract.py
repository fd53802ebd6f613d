"""The SageMaker contract: JobSpec -> the user script's environment and argv.

Pure functions only.  The output matches ``sagemaker-training`` 5.1.x for the
same files (test/integration/test_contract_reference.py compares them), with
the deliberate differences listed in docs/contract.md.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from typing import Any

from training_toolkit.core import names
from training_toolkit.job.spec import JobSpec
from training_toolkit.config.settings import SECRET_VARIABLES, without_secrets

# The toolkit's own secrets: never in the script's environment.
HIDDEN_VARIABLES = SECRET_VARIABLES


def to_arg(value: Any) -> str:
    """One hyperparameter value as one argv item, as the reference renders it."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin1")
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return str(value)


def user_args(hyperparameters: Mapping[str, Any]) -> list[str]:
    """``--key value`` (``-k value`` for one-character keys), sorted by key."""
    args: list[str] = []
    for key in sorted(hyperparameters):
        name = to_arg(key)
        args.append(("--" + name if len(name) > 1 else "-" + name) if name else "")
        args.append(to_arg(hyperparameters[key]))
    return args


def to_env_value(value: Any) -> str:
    """Strings raw, None empty, everything else compact sorted JSON (reference: mapping.to_env_vars)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin1")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def module_name(entry_point: str | None) -> str | None:
    if entry_point and entry_point.endswith(".py"):
        return entry_point[:-3]
    return entry_point


def distribution_instance_groups(job: JobSpec) -> list[str]:
    """The groups named by the job, else the current group when any distribution is switched on."""
    named = job.framework_params.get(names.DISTRIBUTION_INSTANCE_GROUPS)
    if named is not None:
        return list(named)
    if any(job.framework_params.get(key, False) for key in names.SWITCHES):
        return [job.resource.current_group_name]
    return []


def distribution_hosts(job: JobSpec) -> list[str]:
    """``SM_TRAINING_ENV``'s distribution_hosts: every host, or the distribution groups' (maybe none)."""
    if not job.resource.instance_groups:
        return list(job.resource.hosts)
    groups = distribution_instance_groups(job)
    return [h for g in job.resource.instance_groups if g.name in groups for h in g.hosts]


def participating_hosts(job: JobSpec) -> tuple[str, ...]:
    """The hosts that take part in a distribution, in rank order: the distribution hosts, else every host."""
    return tuple(distribution_hosts(job)) or job.resource.hosts


def master_host(job: JobSpec) -> str:
    """The job's master, defined here only: the first participating host.

    It is ``SM_MASTER_HOSTNAME``, the runners' lead (``LaunchPlan.lead``: the control
    channel's server, mpirun's host, the chief) and ``MASTER_ADDR`` for ranks.
    """
    return participating_hosts(job)[0]


def training_env(job: JobSpec, environ: Mapping[str, str]) -> dict[str, Any]:
    """The whole resolved job, as ``SM_TRAINING_ENV`` shows it (every reference property)."""
    res = job.resource
    paths = job.paths
    groups_raw = list(res.raw.get("instance_groups", []))
    dist_hosts = distribution_hosts(job)
    master = master_host(job)
    mp_parameters = environ.get("SM_HP_MP_PARAMETERS")
    return {
        "additional_framework_parameters": dict(job.framework_params),
        "channel_input_dirs": {c: str(paths.channel_dir(c)) for c in job.channels},
        "current_host": res.current_host,
        "current_instance_group": res.current_group_name,
        "current_instance_group_hosts": _current_group_hosts(job),
        "current_instance_type": res.current_instance_type,
        "distribution_hosts": dist_hosts,
        "distribution_instance_groups": distribution_instance_groups(job),
        "framework_module": environ.get("SAGEMAKER_TRAINING_MODULE"),
        "hosts": list(res.hosts),
        "hyperparameters": dict(job.hyperparameters),
        "input_config_dir": str(paths.input_config_dir),
        "input_data_config": dict(job.input_data_config),
        "input_dir": str(paths.input_dir),
        "instance_groups": [g["instance_group_name"] for g in groups_raw],
        "instance_groups_dict": {g["instance_group_name"]: g for g in groups_raw},
        "is_hetero": job.is_hetero,
        "is_master": res.current_host == master,
        "is_modelparallel_enabled": (mp_parameters and mp_parameters != "{}") or None,
        "is_smddpmprun_installed": shutil.which("smddpmprun", path=environ.get("PATH")) is not None,
        "is_smddprun_installed": shutil.which("smddprun", path=environ.get("PATH")) is not None,
        "job_name": environ.get("TRAINING_JOB_NAME"),
        "log_level": job.log_level,
        "master_hostname": master,
        "model_dir": str(paths.model_dir),
        "module_dir": module_dir(job),
        "module_name": module_name(job.entry_point),
        "network_interface_name": res.network_interface_name,
        "num_cpus": job.hardware.num_cpus,
        "num_gpus": job.hardware.num_gpus,
        "num_neurons": job.hardware.num_neurons,
        "output_data_dir": str(paths.output_data_dir),
        "output_dir": str(paths.output_dir),
        "output_intermediate_dir": str(paths.output_intermediate_dir),
        "resource_config": dict(res.raw),
        "topology": list(res.raw.get("topology", [])),
        "user_entry_point": job.entry_point,
    }


def module_dir(job: JobSpec) -> str:
    return job.submit_directory or str(job.paths.code_dir)


def _current_group_hosts(job: JobSpec) -> list[str]:
    for group in job.resource.instance_groups:
        if group.name == job.resource.current_group_name:
            return list(group.hosts)
    return []


def sm_variables(job: JobSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """Every ``SM_*`` variable of the contract."""
    env = training_env(job, environ)
    values: dict[str, Any] = {
        "hosts": env["hosts"],
        "network_interface_name": env["network_interface_name"],
        "hps": env["hyperparameters"],
        "user_entry_point": env["user_entry_point"],
        "framework_params": env["additional_framework_parameters"],
        "resource_config": env["resource_config"],
        "input_data_config": env["input_data_config"],
        "output_data_dir": env["output_data_dir"],
        "channels": sorted(env["channel_input_dirs"]),
        "current_host": env["current_host"],
        "current_instance_type": env["current_instance_type"],
        "current_instance_group": env["current_instance_group"],
        "current_instance_group_hosts": env["current_instance_group_hosts"],
        "instance_groups": env["instance_groups"],
        "instance_groups_dict": env["instance_groups_dict"],
        "distribution_instance_groups": env["distribution_instance_groups"],
        "is_hetero": env["is_hetero"],
        "module_name": env["module_name"],
        "log_level": env["log_level"],
        "framework_module": env["framework_module"],
        "input_dir": env["input_dir"],
        "input_config_dir": env["input_config_dir"],
        "output_dir": env["output_dir"],
        "num_cpus": env["num_cpus"],
        "num_gpus": env["num_gpus"],
        "num_neurons": env["num_neurons"],
        "model_dir": env["model_dir"],
        "module_dir": env["module_dir"],
        "training_env": env,
        "user_args": user_args(job.hyperparameters),
        "output_intermediate_dir": env["output_intermediate_dir"],
    }
    if env["topology"]:
        values["topology"] = env["topology"]
    for name, path in env["channel_input_dirs"].items():
        values[f"channel_{name}"] = path
    for key, value in job.hyperparameters.items():
        values[f"hp_{key}"] = value
    return {f"SM_{str(k).upper()}" if k else "": to_env_value(v) for k, v in values.items()}


def script_environment(
    job: JobSpec, environ: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The user script's whole environment: the parent's, the contract's, then runner extras.

    The platform variables the reference exports for itself (job name, current
    host, region) are set the same way; ``PYTHONPATH`` starts with the code dir.
    """
    env = without_secrets(environ)
    env["SAGEMAKER_JOB_NAME"] = str(job.reserved.get(names.JOB_NAME, "") or "")
    env["CURRENT_HOST"] = job.resource.current_host
    env["SAGEMAKER_REGION"] = job.region or ""
    if job.job_name and not env.get("TRAINING_JOB_NAME"):
        env["TRAINING_JOB_NAME"] = job.job_name
    if job.entry_point:
        env.setdefault("SAGEMAKER_PROGRAM", job.entry_point)
    env.update(sm_variables(job, environ))
    code_dir = str(job.paths.code_dir)
    inherited = [p for p in env.get("PYTHONPATH", "").split(":") if p and p != code_dir]
    env["PYTHONPATH"] = ":".join([code_dir, *inherited])
    if extra:
        env.update(extra)
    env.pop("", None)
    return env
