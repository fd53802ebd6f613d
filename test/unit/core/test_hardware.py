"""hardware.probe counts devices from /proc and /dev and runs no program (plan promises to run nothing)."""

from __future__ import annotations

import os
from pathlib import Path

from training_toolkit.core import hardware


def _root(tmp_path: Path, proc_gpus: int | None = None, dev: tuple[str, ...] = ()) -> Path:
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    if proc_gpus is not None:
        gpus = root / "proc/driver/nvidia/gpus"
        gpus.mkdir(parents=True)
        for i in range(proc_gpus):
            (gpus / f"0000:00:0{i}.0").mkdir()
    for name in dev:
        (root / "dev" / name).touch()
    return root


def test_the_drivers_directory_per_gpu_counts_first(tmp_path: Path):
    root = _root(tmp_path, proc_gpus=2, dev=("nvidia0", "nvidia1", "nvidia2", "nvidiactl"))
    assert hardware.probe(root=root).num_gpus == 2


def test_without_proc_the_device_nodes_count_and_control_nodes_do_not(tmp_path: Path):
    root = _root(tmp_path, dev=("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps"))
    assert hardware.probe(root=root).num_gpus == 2


def test_neuron_devices_are_counted(tmp_path: Path):
    root = _root(tmp_path, dev=("neuron0", "neuron1", "neuronx"))
    assert hardware.probe(root=root).num_neurons == 2


def test_a_given_gpu_count_wins(tmp_path: Path):
    assert hardware.probe(4, root=_root(tmp_path, proc_gpus=1)).num_gpus == 4


def test_no_program_is_run_even_when_nvidia_smi_is_on_path(tmp_path: Path, monkeypatch):
    ran = tmp_path / "ran"
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {ran}\necho 'GPU 0: fake'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert hardware.probe(root=_root(tmp_path)).num_gpus == 0
    assert not ran.exists()
