"""The one writer of ``/opt/ml``: a ``JobView`` laid out through ``Paths``, for every platform and local launcher.

``documents`` is the pure half (the three config files as JSON values), so ``plan`` builds the
same JobSpec from a view that ``run`` reads back from the files ``write_view`` wrote.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from training_toolkit.core.paths import Paths
from training_toolkit.platforms.view import JobView

#: What a host's tree holds before ``train`` starts, as a platform creates it.
DIRECTORIES = ("model", "output/data", "code", "checkpoints")

#: A channel as SageMaker describes a File-mode, fully replicated one.
FILE_CHANNEL = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}


def resource_config(view: JobView) -> dict[str, Any]:
    resource: dict[str, Any] = {"current_host": view.current_host, "hosts": list(view.hosts)}
    if view.interface is not None:
        resource["network_interface_name"] = view.interface
    if view.instance_groups:
        resource["instance_groups"] = [dict(g) for g in view.instance_groups]
        group = next(g for g in view.instance_groups if view.current_host in g["hosts"])
        resource["current_group_name"] = group["instance_group_name"]
        resource["current_instance_type"] = group["instance_type"]
    return resource


def documents(view: JobView) -> dict[str, dict[str, Any]]:
    """``input/config``'s files for ``view``, by file name (pure).  A given view (SageMaker) has none to write."""
    if view.given:
        return {}
    return {"resourceconfig.json": resource_config(view),
            "hyperparameters.json": dict(view.hyperparameters or {}),
            "inputdataconfig.json": {name: dict(channel) for name, channel in (view.channels or {}).items()}}


def write_view(paths: Paths, view: JobView) -> None:
    """Lay ``view`` out under ``paths``: the config files (each replaced atomically) and the tree's directories."""
    config = paths.input_config_dir
    for name, value in documents(view).items():
        config.mkdir(parents=True, exist_ok=True)
        _write_json(config / name, value)
    if not view.given:
        for sub in DIRECTORIES:
            (paths.base / sub).mkdir(parents=True, exist_ok=True)


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)
