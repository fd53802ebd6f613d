"""JobSpec: the job as read from the ``/opt/ml`` files, parsed and validated once.

Parsing is pure apart from reading the three config files: hardware is probed
by the caller (``hardware.probe``) and passed in, the process environment is
passed in as a mapping.  Every problem becomes one ``ConfigError`` naming the
file, the field and what was expected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from training_toolkit.core import names
from training_toolkit.core.errors import ConfigError
from training_toolkit.core.hardware import Hardware
from training_toolkit.core.names import FRAMEWORK_PREFIX, RESERVED_HYPERPARAMETERS
from training_toolkit.core.paths import Paths

DEFAULT_INTERFACE = "eth0"
HOMOGENEOUS_GROUP = "homogeneousCluster"
DEFAULT_INSTANCE_TYPE = "local"
DEFAULT_LOG_LEVEL = 20

_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")
_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class InstanceGroup(NamedTuple):
    name: str
    instance_type: str
    hosts: tuple[str, ...]


class ResourceConfig(NamedTuple):
    current_host: str
    hosts: tuple[str, ...]
    network_interface_name: str
    current_group_name: str
    current_instance_type: str
    instance_groups: tuple[InstanceGroup, ...]
    raw: Mapping[str, Any]  # the file as read, for SM_RESOURCE_CONFIG


class JobSpec(NamedTuple):
    paths: Paths
    resource: ResourceConfig
    hardware: Hardware
    hyperparameters: Mapping[str, Any]  # the user's, decoded
    framework_params: Mapping[str, Any]  # sagemaker_* keys that are not reserved
    reserved: Mapping[str, Any]  # reserved keys, decoded
    input_data_config: Mapping[str, Any]
    channels: tuple[str, ...]
    entry_point: str | None
    submit_directory: str | None
    job_name: str | None
    region: str | None
    log_level: int

    @property
    def is_hetero(self) -> bool:
        return len(self.resource.instance_groups) > 1


def decode_hyperparameter(value: Any) -> Any:
    """Values are JSON-decoded where they parse and kept as they are otherwise (as the reference)."""
    if not isinstance(value, (str, bytes, bytearray)):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def load_job(paths: Paths, environ: Mapping[str, str], hardware: Hardware) -> JobSpec:
    """Read and validate the job's three config files."""
    hyperparameters = _read_json_object(paths.hyperparameters_file, required=True)
    resource_raw = _read_json_object(paths.resource_config_file, required=True)
    data_raw = _read_json_object(paths.input_data_config_file, required=False)
    return build_job(paths, hyperparameters, resource_raw, data_raw, environ, hardware)


def build_job(
    paths: Paths,
    hyperparameters_raw: Mapping[str, Any],
    resource_raw: Mapping[str, Any],
    data_raw: Mapping[str, Any],
    environ: Mapping[str, str],
    hardware: Hardware,
) -> JobSpec:
    """The pure half of ``load_job``: validated objects from decoded JSON."""
    resource = parse_resource_config(resource_raw, source=str(paths.resource_config_file))
    channels = parse_channels(data_raw, source=str(paths.input_data_config_file))
    decoded = {key: decode_hyperparameter(value) for key, value in hyperparameters_raw.items()}
    reserved = {k: v for k, v in decoded.items() if k in RESERVED_HYPERPARAMETERS}
    framework = {
        k: v for k, v in decoded.items() if k.startswith(FRAMEWORK_PREFIX) and k not in RESERVED_HYPERPARAMETERS
    }
    user = {k: v for k, v in decoded.items() if k not in reserved and k not in framework}
    hp_source = str(paths.hyperparameters_file)

    refuse_training_module(environ)
    # As the reference: the SAGEMAKER_PROGRAM variable wins over the hyperparameter,
    # the hyperparameter wins over SAGEMAKER_SUBMIT_DIRECTORY.
    entry_point = environ.get("SAGEMAKER_PROGRAM") or _optional_str(reserved, names.PROGRAM, hp_source)
    submit = _optional_str(reserved, names.SUBMIT_DIRECTORY, hp_source) or environ.get("SAGEMAKER_SUBMIT_DIRECTORY")
    job_name = environ.get("TRAINING_JOB_NAME") or _optional_str(reserved, names.JOB_NAME, hp_source)
    region = (
        _optional_str(reserved, names.REGION, hp_source)
        or environ.get("AWS_REGION")
        or environ.get("AWS_DEFAULT_REGION")
    )
    log_level = reserved.get(names.LOG_LEVEL, DEFAULT_LOG_LEVEL)
    if isinstance(log_level, bool) or not isinstance(log_level, int):
        raise ConfigError(hp_source, names.LOG_LEVEL, f"expected an integer log level, got {log_level!r}")
    groups = framework.get(names.DISTRIBUTION_INSTANCE_GROUPS)
    if groups is not None:
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ConfigError(hp_source, names.DISTRIBUTION_INSTANCE_GROUPS, "expected a JSON list of group names")
        known = {g.name for g in resource.instance_groups}
        unknown = [g for g in groups if g not in known]
        if unknown:
            raise ConfigError(hp_source, names.DISTRIBUTION_INSTANCE_GROUPS, f"unknown instance group(s) {unknown}")
    return JobSpec(
        paths=paths,
        resource=resource,
        hardware=hardware,
        hyperparameters=MappingProxyType(user),
        framework_params=MappingProxyType(framework),
        reserved=MappingProxyType(reserved),
        input_data_config=MappingProxyType(dict(data_raw)),
        channels=channels,
        entry_point=entry_point,
        submit_directory=submit or None,
        job_name=job_name or None,
        region=region or None,
        log_level=log_level,
    )


def with_hosts(job: JobSpec, hosts: tuple[str, ...]) -> JobSpec:
    """``job`` with the hosts the lead gave (the job's membership), in its order; the same job if they agree.

    A host's own view may be partial (an MPIJob worker's: the launcher and itself); the lead's
    list replaces it.  The list is input from the wire: it is checked by the resource config's own rule for
    hosts (``check_hosts``), and nothing else of the job is parsed again.  A heterogeneous cluster's groups
    name their hosts, so it cannot take other hosts.
    """
    if tuple(hosts) == job.resource.hosts:
        return job
    source = str(job.paths.resource_config_file)
    if job.resource.instance_groups:
        raise ConfigError(source, "hosts", f"the lead's hosts {list(hosts)} are not this host's "
                          f"{list(job.resource.hosts)}, and instance groups name their hosts")
    check_hosts(list(hosts), job.resource.current_host, f"{source} (the lead's hosts)")
    return on_hosts(job, tuple(hosts))


def with_framework_params(job: JobSpec, params: Mapping[str, Any]) -> JobSpec:
    """``job`` with ``params`` among its framework parameters (what another host's hyperparameters said for the job,
    where this host's name none).  Pure."""
    if all(job.framework_params.get(key) == value for key, value in params.items()):
        return job
    return job._replace(framework_params=MappingProxyType({**job.framework_params, **params}))


def on_hosts(job: JobSpec, active: tuple[str, ...]) -> JobSpec:
    """``job`` as an attempt on ``active`` (hosts of the job, rank order) runs it: its hosts those, nothing parsed again.

    Every host of ``active`` was checked with the job's hosts; an attempt on fewer hosts than the job's
    (spares, a shrink) has no instance groups (``agent.seats`` refuses both together).
    """
    if tuple(active) == job.resource.hosts:
        return job
    resource = job.resource
    return job._replace(resource=resource._replace(
        hosts=tuple(active), raw=MappingProxyType({**resource.raw, "hosts": list(active)})))


def parse_resource_config(raw: Mapping[str, Any], source: str) -> ResourceConfig:
    hosts, current = raw.get("hosts"), raw.get("current_host")
    check_hosts(hosts, current, source)
    interface = raw.get("network_interface_name", DEFAULT_INTERFACE)
    if not isinstance(interface, str) or not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,32}", interface):
        raise ConfigError(source, "network_interface_name", f"expected an interface name, got {interface!r}")
    groups = _parse_groups(raw.get("instance_groups", []), hosts, source)
    group_name = raw.get("current_group_name", HOMOGENEOUS_GROUP)
    if not isinstance(group_name, str) or not group_name:
        raise ConfigError(source, "current_group_name", f"expected a group name, got {group_name!r}")
    if groups and group_name not in {g.name for g in groups}:
        raise ConfigError(source, "current_group_name", f"{group_name!r} is not one of instance_groups")
    instance_type = raw.get("current_instance_type", DEFAULT_INSTANCE_TYPE)
    if not isinstance(instance_type, str) or not instance_type:
        raise ConfigError(source, "current_instance_type", f"expected an instance type, got {instance_type!r}")
    return ResourceConfig(
        current_host=current,
        hosts=tuple(hosts),
        network_interface_name=interface,
        current_group_name=group_name,
        current_instance_type=instance_type,
        instance_groups=groups,
        raw=MappingProxyType(dict(raw)),
    )


def check_hosts(hosts: Any, current: Any, source: str) -> None:
    """The one rule for a job's hosts, wherever they come from (the resource config, the lead's welcome): a
    non-empty list of valid, distinct host names, this host one of them."""
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError(source, "hosts", "expected a non-empty list of host names")
    for host in hosts:
        _check_host(host, source, "hosts")
    duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
    if duplicates:
        raise ConfigError(source, "hosts", f"duplicate host name(s) {duplicates}")
    if not isinstance(current, str) or not current:
        raise ConfigError(source, "current_host", "expected a host name")
    if current not in hosts:
        raise ConfigError(source, "current_host", f"{current!r} is not one of hosts {hosts}")


def _parse_groups(raw: Any, hosts: list[str], source: str) -> tuple[InstanceGroup, ...]:
    if not isinstance(raw, list):
        raise ConfigError(source, "instance_groups", "expected a list of groups")
    groups = []
    for i, item in enumerate(raw):
        where = f"instance_groups[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(source, where, "expected an object")
        name = item.get("instance_group_name")
        itype = item.get("instance_type")
        members = item.get("hosts")
        if not isinstance(name, str) or not name:
            raise ConfigError(source, f"{where}.instance_group_name", "expected a group name")
        if not isinstance(itype, str) or not itype:
            raise ConfigError(source, f"{where}.instance_type", "expected an instance type")
        if not isinstance(members, list) or not all(isinstance(h, str) for h in members):
            raise ConfigError(source, f"{where}.hosts", "expected a list of host names")
        strangers = [h for h in members if h not in hosts]
        if strangers:
            raise ConfigError(source, f"{where}.hosts", f"host(s) {strangers} are not in hosts")
        groups.append(InstanceGroup(name, itype, tuple(members)))
    return tuple(groups)


def parse_channels(raw: Mapping[str, Any], source: str) -> tuple[str, ...]:
    for name, config in raw.items():
        if not _CHANNEL_NAME.fullmatch(name) or name in (".", ".."):
            raise ConfigError(source, name, "channel names are 1-64 characters of letters, digits, '.', '_', '-'")
        if not isinstance(config, dict):
            raise ConfigError(source, name, "expected an object describing the channel")
    return tuple(raw)


def _check_host(host: Any, source: str, field_name: str) -> None:
    if not isinstance(host, str) or not _HOST_NAME.fullmatch(host):
        raise ConfigError(source, field_name, f"{host!r} is not a valid host name")


def _optional_str(values: Mapping[str, Any], key: str, source: str) -> str | None:
    value = values.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected a string, got {value!r}")
    return value


def _read_json_object(path: Path, required: bool) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise ConfigError(str(path), None, "file is missing") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), None, f"cannot be read: {exc}") from None
    return parse_json_object(text, str(path))


def parse_json_object(text: str, source: str) -> dict[str, Any]:
    """One JSON object from ``text``; a ConfigError naming ``source`` otherwise.  Every JSON file and variable the
    toolkit reads (the config files, a platform's hyperparameters) goes through here."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(source, None, f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(source, None, f"expected a JSON object, got {type(value).__name__}")
    return value


TRAINING_MODULE = "SAGEMAKER_TRAINING_MODULE"


def refuse_training_module(environ: Mapping[str, str]) -> None:
    """``SAGEMAKER_TRAINING_MODULE`` is refused by name, never ignored.

    AWS's framework images set it (``sagemaker_tensorflow_container.training:main``); the
    reference then imports that module and calls it, and the framework's own code runs the
    job with the reference's internals.  This toolkit runs the entry point itself: handing
    the job to code written against another toolkit's internals cannot keep its promises
    (signals, verdict, ranks), and ignoring the variable silently would run something else
    than the image's author meant.  Empty counts as unset, so an image can clear it.
    """
    value = environ.get(TRAINING_MODULE)
    if value:
        raise ConfigError("environment", TRAINING_MODULE,
                          f"{value!r}: this toolkit runs the entry point itself and does not hand the job to a framework "
                          "module; unset the variable (or set it empty) to run the entry point (docs/contract.md)")
