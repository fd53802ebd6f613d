"""Platforms: adapters at the edge, behind one protocol (``view.Platform``), listed once in ``PLATFORMS``.

Each platform turns what it gives a container into one ``JobView``; ``opt_ml.write_view``
lays it out as ``/opt/ml``.  Detection walks ``PLATFORMS`` in order and takes the first whose
facts are present; ``TRAINING_TOOLKIT_PLATFORM`` names one instead.  A new platform is one
module and one line here.  Nothing in the core imports this package.
"""

from __future__ import annotations

from training_toolkit.errors import ConfigError
from training_toolkit.platforms.indexedjob import IndexedJob
from training_toolkit.platforms.jobset import JobSet
from training_toolkit.platforms.mpijob import MPIJob
from training_toolkit.platforms.pod import Pod
from training_toolkit.platforms.pytorchjob import PyTorchJob
from training_toolkit.platforms.sagemaker import SageMaker
from training_toolkit.platforms.tfjob import TFJob
from training_toolkit.platforms.view import Facts, Platform

__all__ = ["AUTO", "PLATFORMS", "SageMaker", "choose", "gather", "names"]

AUTO = "auto"
#: In detection order: the first whose facts a container has is its platform; SageMaker takes the rest.
PLATFORMS: tuple[Platform, ...] = (MPIJob(), TFJob(), PyTorchJob(), JobSet(), IndexedJob(), Pod(), SageMaker())


def names() -> tuple[str, ...]:
    return (AUTO, *(p.name for p in PLATFORMS))


def choose(chosen: str, facts: Facts) -> Platform:
    """The platform ``chosen`` names, or (``auto``) the first detected; a ConfigError naming the known ones."""
    if chosen == AUTO:
        return next(p for p in PLATFORMS if p.detected(facts))
    for platform in PLATFORMS:
        if platform.name == chosen:
            return platform
    raise ConfigError("environment variable TRAINING_TOOLKIT_PLATFORM", None,
                      f"expected one of {', '.join(names())}, got {chosen!r}")


def gather(environ, paths, config, hardware) -> Facts:
    """This container's facts, read through the real file system and host name (the one impure step)."""
    import os

    def read(path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(path, None, f"cannot be read: {exc}") from None

    def listdir(path: str) -> tuple[str, ...]:
        try:
            return tuple(sorted(e.name for e in os.scandir(path) if e.is_dir()))
        except OSError:
            return ()

    return Facts(environ, os.uname().nodename, read, listdir, paths, config, hardware)  # gethostname(), no socket import
