"""The platform seam's shapes: the facts a platform looks at, the job view it makes, and the protocol.

A platform is detected from what it gives a container and turns it, purely, into one
``JobView``; ``write_view`` (``platforms/opt_ml.py``) lays the view out as ``/opt/ml``, and
the core reads ``/opt/ml`` as it reads SageMaker's.  Everything a platform may look at comes
in ``Facts``, read once by the caller, so ``detected`` and ``view`` are pure and testable with
exact values, and ``plan`` shows in a pod what ``run`` does (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from training_toolkit.core.errors import ConfigError
from training_toolkit.core.hardware import Hardware
from training_toolkit.core.paths import Paths
from training_toolkit.config.settings import NO_OVERRIDES, Overrides, Settings

EMPTY: Mapping[str, Any] = MappingProxyType({})
IN_A_POD = "KUBERNETES_SERVICE_HOST"  # the kubelet gives it to every container of every pod


class Facts(NamedTuple):
    """Everything a platform may look at, read once: no platform reads the environment or a file itself."""

    environ: Mapping[str, str]
    hostname: str
    read: Callable[[str], str | None]  # a file's text (a mounted ConfigMap, /etc/hosts), or None when missing
    listdir: Callable[[str], tuple[str, ...]]  # the directories in a directory (channels mounted under input/data)
    paths: Paths
    settings: Settings  # parsed once, before any platform looks: the platforms' own settings included
    hardware: Hardware


class JobView(NamedTuple):
    """What every platform turns its facts into; ``write_view`` lays it out as ``/opt/ml``."""

    platform: str
    hosts: tuple[str, ...]  # names the job uses for its hosts, in rank order: hosts[0] is the platform's first host
    current_host: str
    interface: str | None = "eth0"  # None: resourceconfig.json names none (SageMaker's local mode)
    hyperparameters: Mapping[str, str] | None = None  # JSON text per key as SageMaker stores them; None: given
    channels: Mapping[str, Mapping[str, str]] | None = None  # inputdataconfig.json; None: given
    overrides: Overrides = NO_OVERRIDES
    restart_attempt: int = 0  # what the platform says of restarts (JobSet's restart-attempt label)
    instance_groups: tuple[Mapping[str, Any], ...] = ()  # heterogeneous clusters (local launchers)
    container_restarts: int = 0  # earlier runs of this container in its pod (Kubernetes restarts it in place)
    given: bool = False  # True: /opt/ml already holds this view (SageMaker); write_view leaves it as it is
    notes: tuple[str, ...] = ()  # what the platform wants logged about the view (a restart, a worker's partial view)
    unset: tuple[str, ...] = ()  # variables of train's own task that no child may inherit (Slurm's per-task ones)


class Platform(Protocol):
    """One platform.  ``detected`` and ``view`` are pure; ``wait`` and ``report_end`` are the only side effects."""

    name: str  # the value of TRAINING_TOOLKIT_PLATFORM / --platform

    def detected(self, facts: Facts) -> bool:
        """Are these this platform's facts?  Walked in registry order (``platforms.PLATFORMS``)."""

    def view(self, facts: Facts) -> JobView:
        """The job as this platform gives it; a ConfigError naming the fact on bad input."""

    def wait(self, view: JobView, settings: Settings) -> None:
        """Bounded: until the platform's peers can be reached (pod DNS), a ClusterError naming what never came."""

    def report_end(self, facts: Facts, view: JobView | None, exit_code: int, reason: str | None) -> None:
        """The platform's own way to report the verdict (the termination log); ``view`` None: it could not be made."""


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
