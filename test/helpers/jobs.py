"""Job trees on disk, the toolkit's commands, and a clean environment to run them in."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.paths import BIN


def write_job(
    base: Path,
    *,
    hyperparameters: dict | None = None,
    resourceconfig: dict | None = None,
    inputdataconfig: dict | None = None,
    script: str | None = None,
    entry: str = "train.py",
    code_dir: Path | None = None,
) -> Path:
    """A job tree under ``base``; ``script`` becomes the entry point in a submit dir."""
    config = base / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    hps = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in (hyperparameters or {}).items()}
    if script is not None:
        src = code_dir or base.parent / f"{base.name}-src"
        src.mkdir(parents=True, exist_ok=True)
        (src / entry).write_text(script)
        hps.setdefault("sagemaker_program", json.dumps(entry))
        hps.setdefault("sagemaker_submit_directory", json.dumps(str(src)))
    (config / "hyperparameters.json").write_text(json.dumps(hps))
    rc = resourceconfig or {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}
    (config / "resourceconfig.json").write_text(json.dumps(rc))
    if inputdataconfig is not None:
        (config / "inputdataconfig.json").write_text(json.dumps(inputdataconfig))
        for channel in inputdataconfig:
            (base / "input" / "data" / channel).mkdir(parents=True, exist_ok=True)
    return base


def train_cmd() -> list[str]:
    return [str(BIN / "train")]


def toolkit_cmd() -> list[str]:
    return [str(BIN / "training-toolkit")]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "TRAINING_"))}
    env.update(extra)
    return env
