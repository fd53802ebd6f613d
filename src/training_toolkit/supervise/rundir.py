"""Where a host's runtime files go: the job's ssh files, its ranks' file, the stall watch's stacks.

Each is a new private directory (0700, ``tempfile.mkdtemp``: a random name, made with
``O_EXCL``-like care) under the first of these that fits:

1. ``/run`` where we may write there (root; a container's or a namespace host's own tmpfs);
2. ``$XDG_RUNTIME_DIR`` where it is an existing directory of ours, private (0700) and writable
   (the per-user tmpfs ``pam_systemd`` makes, ``/run/user/UID``; a value carried from another
   machine, as sbatch's exported environment carries it, is passed over when it is not ours here);
3. ``$TMPDIR`` where it is an existing directory we may write (a job's own, as many Slurm
   sites give one);
4. ``/tmp``.

The name is random, never the job's id alone: hosts may share the parent (the nodes of a
cluster sharing ``/tmp``, or ``TMPDIR`` on shared storage), and a name every host computed
alike made the second host fail ("File exists").  ``choose_parent`` is the pure rule.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

RUN = Path("/run")
TMP = Path("/tmp")


class DirFacts(NamedTuple):
    """What the rule needs to know of a directory (``None`` from ``look``: it does not exist, or is not one)."""

    uid: int
    mode: int  # the permission bits
    writable: bool  # by us (os.access W_OK and X_OK)


def choose_parent(environ: Mapping[str, str], euid: int, look: Callable[[Path], DirFacts | None]) -> Path:
    """The parent for this host's runtime directories (the module's rule), from facts alone."""
    run = look(RUN)
    if run is not None and run.writable:
        return RUN
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        facts = look(Path(runtime))
        if facts is not None and facts.writable and facts.uid == euid and facts.mode & 0o077 == 0:
            return Path(runtime)
    tmpdir = environ.get("TMPDIR", "")
    if os.path.isabs(tmpdir):
        facts = look(Path(tmpdir))
        if facts is not None and facts.writable:
            return Path(tmpdir)
    return TMP


def look(path: Path) -> DirFacts | None:
    """The facts of ``path`` on this host (following links), or None where it is not a directory."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return DirFacts(st.st_uid, stat.S_IMODE(st.st_mode), os.access(path, os.W_OK | os.X_OK))


def parent(environ: Mapping[str, str]) -> Path:
    """This host's parent for runtime directories (``choose_parent`` on this host's facts and the toolkit's
    environment as read at its start: ``RunContext.environ``)."""
    return choose_parent(environ, os.geteuid(), look)


def new_private_dir(prefix: str, under: Path) -> Path:
    """A new 0700 directory of a random name under ``under`` (``parent``); OSError if it cannot be made."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=under))
