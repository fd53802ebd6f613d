"""Platforms: adapters at the edge, behind one protocol (``view.Platform``), listed once in ``PLATFORMS``.

Each platform turns what it gives a container into one ``JobView``; ``opt_ml.write_view``
lays it out as ``/opt/ml``.  Detection walks ``PLATFORMS`` in order and takes the first whose
facts are present; ``TRAINING_TOOLKIT_PLATFORM`` names one instead.  A new platform is one
module and one line here.  Nothing in the core imports this package.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from training_toolkit.core.errors import ConfigError
from training_toolkit.platforms.view import IN_A_POD, Facts, Platform

__all__ = ["AUTO", "PLATFORMS", "Entry", "choose", "gather", "load", "names"]

AUTO = "auto"


class Entry(NamedTuple):
    """One registry line: a platform's name, where it is, and a variable every one of its containers has.

    Without that variable the platform is not even imported: the launch path on SageMaker pays for
    SageMaker alone.  The platform's own ``detected`` decides the rest.
    """

    name: str
    where: str  # "module:Class" under training_toolkit.platforms
    requires: str | None = None


#: In detection order: the first whose facts a container has is its platform; SageMaker takes the rest.
PLATFORMS: tuple[Entry, ...] = (
    Entry("mpijob", "mpijob:MPIJob", IN_A_POD),
    Entry("tfjob", "tfjob:TFJob", IN_A_POD),
    Entry("pytorchjob", "pytorchjob:PyTorchJob", IN_A_POD),
    Entry("jobset", "jobset:JobSet", IN_A_POD),
    Entry("job", "indexedjob:IndexedJob", IN_A_POD),
    Entry("slurm", "slurm:Slurm", "SLURM_JOB_ID"),
    Entry("pod", "pod:Pod", IN_A_POD),
    Entry("sagemaker", "sagemaker:SageMaker"),
)


def names() -> tuple[str, ...]:
    return (AUTO, *(e.name for e in PLATFORMS))


def load(entry: Entry) -> Platform:
    module, _, cls = entry.where.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


def choose(chosen: str, facts: Facts) -> Platform:
    """The platform ``chosen`` names, or (``auto``) the first detected; a ConfigError naming the known ones."""
    for entry in PLATFORMS:
        if chosen == AUTO:
            if entry.requires is None or facts.environ.get(entry.requires):
                platform = load(entry)
                if platform.detected(facts):
                    return platform
        elif entry.name == chosen:
            return load(entry)
    if chosen == AUTO:
        raise AssertionError("the registry's last platform is detected always")
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
