"""``sagemaker_mpi_custom_mpi_options``, read as the reference reads it, split three ways.  Pure.

The SageMaker SDK documents ``--NCCL_DEBUG=WARN`` there, next to mpirun's own options.
The reference parses the string with ``argparse.parse_known_args``: ``--NCCL_DEBUG``
(``=VALUE`` or ``VALUE``) becomes the ranks' ``NCCL_DEBUG``, everything else goes to
mpirun.  Here, in addition, mpirun's ``-x NAME[=VALUE]`` is taken out too: each host's
``train`` sets that variable for its own ranks (``runners/rank_env.py``), because mpirun
would carry the value to every host in clear.  The rest is mpirun's, as an argv list.

Differences from the reference, on purpose (docs/contract.md): the string is split like a
shell splits words (quotes group; the reference splits at every space and would cut
``-x "A=b c"`` in two) and never given to a shell; argparse's abbreviations
(``--NCCL=WARN``) are not accepted, and go to mpirun, which names them in its error.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, NamedTuple

from training_toolkit.core.errors import ConfigError

NCCL_DEBUG_OPTION = "--NCCL_DEBUG"
FORWARD_OPTIONS = ("-x", "--x")  # mpirun's "export this variable to the ranks" (Open MPI 4 and 5)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CustomMpiOptions(NamedTuple):
    mpirun_args: tuple[str, ...] = ()  # for mpirun, in the order given
    nccl_debug: str | None = None  # --NCCL_DEBUG's value, the last one given
    rank_variables: tuple[tuple[str, str | None], ...] = ()  # -x NAME=VALUE, or NAME alone (None: the host's own value)


def parse_custom_options(value: Any, source: str, key: str) -> CustomMpiOptions:
    """The options of ``key``; a ConfigError naming the key and the word for what cannot be read."""
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected a string, got {value!r}")
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ConfigError(source, key, f"cannot be parsed: {exc}") from None
    mpirun: list[str] = []
    nccl_debug: str | None = None
    variables: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == NCCL_DEBUG_OPTION or word.startswith(NCCL_DEBUG_OPTION + "="):
            if "=" in word:
                nccl_debug = word.split("=", 1)[1]
            elif i + 1 < len(words) and not words[i + 1].startswith("-"):
                i += 1
                nccl_debug = words[i]
            else:
                raise ConfigError(source, key, f"{NCCL_DEBUG_OPTION} needs a value (e.g. {NCCL_DEBUG_OPTION}=WARN)")
        elif word in FORWARD_OPTIONS:
            if i + 1 >= len(words):
                raise ConfigError(source, key, f"{word} needs NAME or NAME=VALUE")
            i += 1
            name, has_value, text = words[i].partition("=")
            if not _ENV_NAME.match(name):
                raise ConfigError(source, key, f"{word} {words[i]!r}: {name!r} is not a variable name")
            variables.append((name, text if has_value else None))
        else:
            mpirun.append(word)
        i += 1
    return CustomMpiOptions(tuple(mpirun), nccl_debug, tuple(variables))
