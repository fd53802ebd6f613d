"""What this host has: CPUs, GPUs, Neuron devices.  Probed once per run.

Probing reads ``/proc`` and ``/dev`` and runs no program (not ``nvidia-smi``):
it is cheap enough to stay out of the launch overhead, ``plan`` may call it
(it promises to run nothing), and the result is passed around as a value,
never probed again.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple
from pathlib import Path


class Hardware(NamedTuple):
    num_cpus: int
    num_gpus: int
    num_neurons: int


def probe(num_gpus: int | None = None, root: Path = Path("/")) -> Hardware:
    """Count devices.  ``num_gpus`` (``Settings.num_gpus``) replaces the GPU count (for tests and odd drivers)."""
    gpus = num_gpus if num_gpus is not None else _count_gpus(root)
    return Hardware(num_cpus=os.cpu_count() or 1, num_gpus=gpus, num_neurons=_count_neurons(root))


_GPU_DEVICE = re.compile(r"nvidia\d+")


def _count_gpus(root: Path) -> int:
    """The driver's one directory per GPU; else the device nodes a container is given (``/dev/nvidiaN``).

    The NVIDIA container runtime mounts only the visible GPUs' entries in both places.
    """
    proc = root / "proc/driver/nvidia/gpus"
    try:
        return sum(1 for _ in proc.iterdir())
    except OSError:
        pass
    try:
        return sum(1 for p in (root / "dev").iterdir() if _GPU_DEVICE.fullmatch(p.name))
    except OSError:
        return 0


def _count_neurons(root: Path) -> int:
    dev = root / "dev"
    try:
        return sum(1 for p in dev.iterdir() if p.name.startswith("neuron") and p.name[6:].isdigit())
    except OSError:
        return 0
