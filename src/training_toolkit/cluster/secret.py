"""The job's secret, when the platform gives one: what authenticates the control channel.

From the platform's environment (``TRAINING_TOOLKIT_JOB_SECRET``), or a mounted
file (``input/config/job_secret``, e.g. a Kubernetes secret).  Where neither is
given, as on SageMaker, there is no secret, and none is made up: hosts are then
admitted to the channel by address, and every key is random (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from training_toolkit.errors import ConfigError
from training_toolkit.job import JobSpec
from training_toolkit.settings import JOB_SECRET as SECRET_VAR
from training_toolkit.settings import MIN_SECRET_BYTES


def job_secret(job: JobSpec, environ: Mapping[str, str]) -> bytes | None:
    """The platform's secret for this job, or None when it gave none."""
    raw = environ.get(SECRET_VAR)
    if raw:
        return _checked(raw.encode(), f"environment variable {SECRET_VAR}")
    path = job.paths.job_secret_file
    try:
        data = path.read_bytes().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot be read: {exc}") from None
    return _checked(data, str(path))


def _checked(value: bytes, source: str) -> bytes:
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigError(source, None, f"the job secret must be at least {MIN_SECRET_BYTES} bytes")
    return value
