"""A job's artifacts as SageMaker's local mode leaves them: every host's model/ and output/ merged, and tarred.

The SDK (``sagemaker.local.image._SageMakerContainer.retrieve_artifacts``) copies
each host's ``/opt/ml/model`` into ``artifacts/model`` and ``/opt/ml/output``
into ``artifacts/output``, host after host (a later host's file replaces an
earlier one's), then tars each directory's top-level entries into
``model.tar.gz`` and ``output.tar.gz``.  The per-host trees stay where they are.
"""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

MODEL_TAR = "model.tar.gz"
OUTPUT_TAR = "output.tar.gz"


def collect(host_trees: Sequence[Path], destination: Path) -> tuple[Path, Path]:
    """Merge the hosts' ``model/`` and ``output/`` into ``destination/artifacts`` and tar them; the two tar paths."""
    merged = destination / "artifacts"
    tars = []
    for part, tar_name in (("model", MODEL_TAR), ("output", OUTPUT_TAR)):
        target = merged / part
        target.mkdir(parents=True, exist_ok=True)
        for opt_ml in host_trees:
            if (opt_ml / part).is_dir():
                shutil.copytree(opt_ml / part, target, dirs_exist_ok=True, symlinks=True)
        tar_path = destination / tar_name
        with tarfile.open(tar_path, "w:gz") as tar:
            for entry in sorted(target.iterdir()):
                tar.add(entry, arcname=entry.name)
        tars.append(tar_path)
    return tars[0], tars[1]
