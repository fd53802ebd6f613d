"""The job's secret: what authenticates the control channel and seeds the SSH keys.

From the platform's environment (``TRAINING_TOOLKIT_JOB_SECRET``), or a mounted
file (``input/config/job_secret``).  Where neither is given, as on SageMaker, a
secret is derived from what every host shares (job name and hosts): the hosts
still agree without a shared disk, but the job is then only as private as its
network, and we say so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from training_toolkit.contract import SECRET_VAR
from training_toolkit.errors import ConfigError
from training_toolkit.job import JobSpec

MIN_SECRET_BYTES = 16


@dataclass(frozen=True)
class JobSecret:
    value: bytes = field(repr=False)
    source: str  # "environment", "file" or "derived"

    @property
    def derived(self) -> bool:
        return self.source == "derived"


def job_secret(job: JobSpec, environ: Mapping[str, str]) -> JobSecret:
    raw = environ.get(SECRET_VAR)
    if raw:
        return JobSecret(_checked(raw.encode(), f"environment variable {SECRET_VAR}"), "environment")
    path = job.paths.job_secret_file
    try:
        data = path.read_bytes().strip()
    except FileNotFoundError:
        data = None
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot be read: {exc}") from None
    if data is not None:
        return JobSecret(_checked(data, str(path)), "file")
    shared = "\0".join(["training-toolkit-derived-v1", job.job_name or "", *job.resource.hosts])
    return JobSecret(hashlib.sha256(shared.encode()).digest(), "derived")


def _checked(value: bytes, source: str) -> bytes:
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigError(source, None, f"the job secret must be at least {MIN_SECRET_BYTES} bytes")
    return value
