"""What an operator's facts become: the job's hosts, this pod's host, and framework defaults.

A pure value; ``kubernetes.py`` writes it out as ``/opt/ml/input/config/*.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from training_toolkit.errors import ConfigError

TFJOB = "tfjob"
PYTORCHJOB = "pytorchjob"
MPIJOB = "mpijob"
JOBSET = "jobset"
POD = "pod"  # a plain pod or Job on Kubernetes: one host, no operator
OPERATORS = (TFJOB, PYTORCHJOB, MPIJOB, JOBSET, POD)
SAGEMAKER = "sagemaker"  # /opt/ml is already there: nothing to adapt
AUTO = "auto"
PLATFORMS = (AUTO, SAGEMAKER, *OPERATORS)


class PodView(NamedTuple):
    operator: str
    hosts: tuple[str, ...]  # resolvable names, in rank order: hosts[0] is the job's first host
    current_host: str
    framework_params: Mapping[str, Any] = MappingProxyType({})  # defaults from the operator's facts
    restart_attempt: int = 0  # JobSet's restart attempt (0 elsewhere)


def integer(environ: Mapping[str, str], name: str, source: str, minimum: int = 0) -> int:
    raw = environ.get(name, "")
    if not raw.isascii() or not raw.isdigit() or int(raw) < minimum:
        raise ConfigError(source, name, f"expected a whole number >= {minimum}, got {raw!r}")
    return int(raw)


def split_endpoint(endpoint: str, source: str, field: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(source, field, f"expected HOST:PORT, got {endpoint!r}")
    return host, int(port)
