"""What this host has: CPUs, GPUs, Neuron devices.  Probed once per run.

Probing reads ``/proc`` and ``/dev`` rather than spawning ``nvidia-smi``: it is
cheap enough to stay out of the launch overhead, and the result is passed
around as a value, never probed again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


def _count_gpus(root: Path) -> int:
    proc = root / "proc/driver/nvidia/gpus"
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "--list-gpus"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _count_neurons(root: Path) -> int:
    dev = root / "dev"
    try:
        return sum(1 for p in dev.iterdir() if p.name.startswith("neuron") and p.name[6:].isdigit())
    except OSError:
        return 0
