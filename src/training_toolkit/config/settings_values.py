"""The kinds of value a setting may take: raw text in, a typed value out (pure).

Each is a function of the variable's text that returns its value or raises
``ValueError("expected ...")``; ``settings.parse`` turns that into the one
``ConfigError`` naming the variable.  The table that says which variable is of
which kind is ``settings.VARIABLES``.  Two rules serve every number: a
decimal number of seconds within its bound (``_decimal``), and a whole number
of ASCII digits at least its least value (``_whole``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from training_toolkit.core import names

MIN_SECRET_BYTES = 16  # shorter secrets could be searched for offline by anyone who saw one join


class KeyFiles(NamedTuple):
    """Where mounted ssh keys are, by file name; ``host`` None: no host key is mounted, one is made on the host.

    ``TRAINING_TOOLKIT_SSH_KEYS`` names a directory in the toolkit's own naming; a platform that mounts keys
    under other names (mpi-operator: ``id_rsa``, no host key) says so with its own ``KeyFiles``.
    """

    directory: str
    client: str = "id_ed25519"
    client_public: str = "id_ed25519.pub"
    host: str | None = "ssh_host_ed25519_key"
    host_public: str | None = "ssh_host_ed25519_key.pub"


def _decimal(raw: str, zero_allowed: bool, expected: str) -> float:
    """A finite number, above 0 (or 0 too when ``zero_allowed``); else ``ValueError(expected)``."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        raise ValueError(expected)
    return value


def _whole(raw: str, least: int, expected: str, most: int | None = None) -> int:
    """ASCII digits of a whole number from ``least`` (to ``most``); else ``ValueError(expected)``."""
    if not raw.isascii() or not raw.isdigit() or int(raw) < least or (most is not None and int(raw) > most):
        raise ValueError(expected)
    return int(raw)


def text(raw: str) -> str:
    return raw


def seconds(raw: str) -> float:
    """A positive, finite number of seconds."""
    return _decimal(raw, False, "expected a positive number of seconds")


def grace(raw: str) -> float:
    """Seconds, 0 allowed (kill at once)."""
    return _decimal(raw, True, "expected a number of seconds, 0 or more")


def seconds_or_off(raw: str) -> float | None:
    """Seconds, or 0 for "never" (None)."""
    return _decimal(raw, True, "expected a number of seconds (0: never)") or None


def port(raw: str) -> int:
    return _whole(raw, 1, "expected a port number (1-65535)", most=65535)


def count(raw: str) -> int:
    return _whole(raw, 0, "expected a whole number, 0 or more")


def completions(raw: str) -> int:
    return _whole(raw, 1, "expected a whole number of pods, 1 or more")


def hosts(raw: str) -> int:
    return _whole(raw, 1, "expected a whole number of hosts, 1 or more")


def on_off(raw: str) -> bool:
    if raw.lower() not in ("on", "off"):
        raise ValueError("expected on or off")
    return raw.lower() == "on"


def platform(raw: str) -> str:
    """A platform's name; which names exist is the registry's to say (``platforms.PLATFORMS``), not this table's."""
    if not raw.isascii() or not raw.replace("-", "").replace("_", "").isalnum() or not raw[0].isalpha():
        raise ValueError("expected a platform's name (auto, sagemaker, tfjob, pytorchjob, mpijob, jobset, job, pod)")
    return raw.lower()


def secret(raw: str | bytes) -> bytes:
    """The job secret, from its variable's text or its file's bytes (stripped): at least ``MIN_SECRET_BYTES``."""
    value = raw.encode() if isinstance(raw, str) else raw.strip()
    if len(value) < MIN_SECRET_BYTES:
        raise ValueError(f"the job secret must be at least {MIN_SECRET_BYTES} bytes")
    return value


def key_files(raw: str) -> KeyFiles:
    return KeyFiles(raw)


def one_of(choices: tuple[str, ...]):
    """A value that must be one of ``choices`` (the MPI flavours, the MPI launchers: ``names``)."""
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(f"expected {' or '.join(choices)}")
        return raw
    return parse


mpi_flavor = one_of(names.MPI_FLAVORS)
mpi_launcher = one_of(names.MPI_LAUNCHERS)
