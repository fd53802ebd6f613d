"""Which names hold secrets (environment variables, hyperparameters), so that nothing prints their values."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_KEY|API_KEY|^AWS_.*KEY", re.IGNORECASE)
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact(values: Mapping[str, object]) -> dict[str, object]:
    """``values`` with the value of every name that looks secret replaced."""
    return {k: (REDACTED if is_secret(k) else v) for k, v in values.items()}
