"""The toolkit's one way to tell the operator something: ``training-toolkit: message`` on stderr.

The user script's output goes through untouched; the toolkit's own lines carry
this prefix so they can be told apart from it in a job's log.
"""

from __future__ import annotations

import sys

PREFIX = "training-toolkit: "


def log(message: str) -> None:
    """One line on stderr, flushed at once; never raises (it also runs during teardown)."""
    try:
        sys.stderr.write(f"{PREFIX}{message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed or gone: nobody is left to tell
        pass
