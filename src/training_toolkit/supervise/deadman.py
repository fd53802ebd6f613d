"""The dead-man switch: what must not outlive its owner ends when the owner dies, even by SIGKILL.

In a container (and in a host of ``training-toolkit local``) the kernel ends every process when the
first one dies.  On a bare host it does not: SIGKILL to ``train`` would leave the script, mpirun and
its ranks, sshd and the job's keys behind; and nothing in the kernel ends the containers of a
``training-toolkit local --image`` job when ``local`` dies.  Both are covered by one mechanism:

- the owner arms a ``Deadman``: the native program ``training-toolkit-deadman`` (``native/deadman.c``;
  about 1 MB of memory, a quarter of a millisecond to start, blocked in ``read``), in a session of
  its own (what kills the owner's process group, a CI job's timeout, does not reach it), reading a
  pipe from the owner;
- it has a *token* (``TRAINING_TOOLKIT_SUPERVISOR=<random>``): a process the owner starts with
  ``environment()`` carries it, and so does whatever that process starts without clearing its
  environment; the owner may name other markers of the same kind (``NAME=VALUE``: the MPI ranks'
  ``TRAINING_TOOLKIT_RANK_TAG``), processes to hold (``watch``: sshd, whose title overwrites its
  environment) and directories to remove;
- the owner says ``done`` (``DONE``, the one word of the protocol) once it has ended and removed all
  that itself: the deadman exits at once;
- the end of the pipe without ``done`` means the owner died: the deadman SIGKILLs every process it
  holds or that carries a marker, and their descendants, through pidfds, each checked to be the
  process its look found (``supervise.pidfd`` says how); removes the directories; and, given
  ``then``, runs that program in its place (the container reaper, ``local/reaper.py``).

Processes are never matched by their command line.  A process that dropped the token from its
environment and left the tree of every process found (a daemon a script starts with a clean
environment) stays: docs/multihost.md says so.  Where the native program is missing (a source tree
whose C parts were never built) nothing is armed, and that is said once.
"""

from __future__ import annotations

import os
import subprocess
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from training_toolkit import native
from training_toolkit.config import settings
from training_toolkit.supervise import procfs

#: What the owner writes when it has ended and removed everything itself.
DONE = b"done\n"
#: The variable of the token: every deadman's, and the supervised children's (``process.TOKEN_VAR``).
TOKEN_VAR = settings.SUPERVISOR_VAR
PROGRAM = native.DEADMAN_PROGRAM

_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
#: Armed deadmen by the directories they remove: what is started for a directory (sshd, ssh's shared
#: connections) is handed to the deadman of that directory.
_BY_DIRECTORY: weakref.WeakValueDictionary[str, Deadman] = weakref.WeakValueDictionary()
_warned = False


class Deadman:
    """Armed at construction; ``disarm()`` once what it watches is ended and removed.

    ``markers``: more ``NAME=VALUE`` environment entries of processes to end, beside its own token;
    ``directories``: removed, and what carries their token (``environment_for``) or is handed to it
    (``watch_for``) is ended;
    ``then``: a command run in its place once it has acted (its standard error is the owner's);
    ``env``: that command's environment (default: a bare PATH); ``pidfds=False``: the fallback the
    program takes where the kernel has none (checked pids), for tests.
    """

    def __init__(self, markers: Sequence[str] = (), directories: Sequence[Path] = (), *,
                 then: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 pidfds: bool = True) -> None:
        self.token = os.urandom(8).hex()
        self.marker = f"{TOKEN_VAR}={self.token}"
        self.directories = tuple(Path(d) for d in directories)
        argv = [_program(), *([] if pidfds else ["--no-pidfd"]), "--marker", self.marker]
        for marker in markers:
            argv += ["--marker", marker]
        for directory in self.directories:
            argv += ["--marker", f"{TOKEN_VAR}={directory_token(directory)}", "--dir", str(directory)]
        if then:
            argv += ["--then", *then]
        self._proc: subprocess.Popen[bytes] | None = None
        if argv[0]:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=None if then else subprocess.DEVNULL,
                                          env=dict(env if env is not None else _ENV),
                                          start_new_session=True, close_fds=True)
            for directory in self.directories:
                _BY_DIRECTORY[str(directory)] = self
        # Whoever drops it without disarming it is done with what it watches (train disarms at the end).
        self._finalizer = weakref.finalize(self, _disarm, self._proc)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def environment(self) -> dict[str, str]:
        """The token, for the environment of a process that must end with the owner."""
        return {TOKEN_VAR: self.token}

    def watch(self, pid: int) -> None:
        """Hold this process (a child of the caller not reaped yet), and its descendants, for the owner's death."""
        proc = procfs.read(pid)
        if proc is not None:
            self._say(f"watch {pid} {proc.start}\n".encode())

    def disarm(self) -> None:
        """What it watches is gone: let it go without acting (once; again is a no-op)."""
        self._finalizer()

    def _say(self, line: bytes) -> None:
        if self._proc is None or self._proc.stdin is None or not self._finalizer.alive:
            return
        try:
            self._proc.stdin.write(line)
            self._proc.stdin.flush()
        except (OSError, ValueError):
            pass


def covering(path: Path) -> Deadman | None:
    """The armed deadman that removes ``path`` or a directory above it, if any."""
    for directory in (Path(path), *Path(path).parents):
        found = _BY_DIRECTORY.get(str(directory))
        if found is not None and found._finalizer.alive:
            return found
    return None


def watch_for(path: Path, pid: int) -> None:
    """Hand a process started for ``path`` (sshd for its ssh directory) to the deadman that removes it."""
    deadman = covering(path)
    if deadman is not None:
        deadman.watch(pid)


def directory_token(directory: Path) -> str:
    """The token of what is started for a directory of the job (a fresh temporary one), whether or not a
    deadman removes it yet: the same kind of token, derived from the path instead of drawn at random."""
    import hashlib

    return "dir-" + hashlib.sha256(os.fsencode(os.path.abspath(directory))).hexdigest()[:16]


def environment_for(directory: Path) -> dict[str, str]:
    """The token for a process started for ``directory`` (ssh's shared connections for the ssh directory):
    the deadman removing the directory ends it; ``marker_for`` finds it."""
    return {TOKEN_VAR: directory_token(directory)}


def marker_for(directory: Path) -> bytes:
    """The environment entry of the processes started for ``directory`` (``environment_for``)."""
    return f"{TOKEN_VAR}={directory_token(directory)}".encode()


def _program() -> str:
    global _warned
    try:
        return str(native.path_of(PROGRAM))
    except native.NativeMissing as exc:
        if not _warned:
            _warned = True
            from training_toolkit.core.log import log

            log(f"warning: no dead-man switch, so processes are not ended should their owner be killed: {exc}")
        return ""


def _disarm(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.write(DONE)
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
