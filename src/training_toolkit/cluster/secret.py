"""The job's secret, when the platform gives one: what authenticates the control channel.

``settings.parse`` reads it once, from ``TRAINING_TOOLKIT_JOB_SECRET`` or the mounted file
``input/config/job_secret`` (a platform such as MPIJob may stand in with one of its own,
``settings.Overrides``), and ``cli`` drops it from the environment it passes on.  Where none
is given, as on SageMaker, none is made up: hosts are then admitted to the channel by
address, and every key is random (docs/security.md).
"""

from __future__ import annotations

from training_toolkit.settings import Settings
from training_toolkit.settings_values import MIN_SECRET_BYTES

__all__ = ["MIN_SECRET_BYTES", "job_secret"]


def job_secret(config: Settings) -> bytes | None:
    """The platform's secret for this job, or None when it gave none."""
    return config.job_secret
