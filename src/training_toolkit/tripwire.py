"""What a ``train`` that is killed leaves behind ends all the same: tripwires.

In a container (and in a host of ``training-toolkit local``) the kernel ends every
process when the first one dies.  On a bare host it does not: SIGKILL to ``train``
would leave the script, mpirun and its ranks, sshd and the job's ssh keys behind.
So each of these is watched by a *tripwire*: a ``sh`` in a session of its own,
reading a pipe from ``train``.  ``train`` writes ``done`` once it has ended and
removed what the tripwire watches; the end of the pipe without ``done`` means
``train`` died, and the tripwire SIGKILLs, until none is left, every process

- whose environment carries a supervised child's token (the script or mpirun, and
  whatever it started that kept its environment: ranks, workers), or
- whose command line names the job's own directory (sshd, ssh's shared connections),

then removes that directory (the job's keys).  It costs one ``sh`` blocked in ``read``.

A process that dropped the token from its environment and left its parent's tree
(a daemon a script starts with a clean environment) stays: docs/multihost.md says so.
"""

from __future__ import annotations

import subprocess
import weakref
from pathlib import Path

#: What ``train`` writes when it has ended the watched processes itself.
DONE = b"done\n"

#: Run as ``sh -c SCRIPT``, told what to watch in its environment (``TRIPWIRE_MARKER``, ``TRIPWIRE_DIR``,
#: either may be empty), not in its command line, which ``grep -z -F`` searches.  ``grep -z -x`` matches
#: one whole NUL-separated environment entry.  Up to 50 rounds 0.1 s apart catch what forks while it
#: is being killed.
SCRIPT = r"""read -r said
[ "$said" = done ] && exit 0
watched() {
    [ -z "$TRIPWIRE_MARKER" ] || grep -lzx -e "$TRIPWIRE_MARKER" /proc/[0-9]*/environ 2>/dev/null
    [ -z "$TRIPWIRE_DIR" ] || grep -lzF -e "$TRIPWIRE_DIR" /proc/[0-9]*/cmdline 2>/dev/null
}
n=0
while [ $n -lt 50 ]; do
    pids=$(watched | cut -d/ -f3)
    [ -n "$pids" ] || break
    kill -9 $pids 2>/dev/null
    sleep 0.1
    n=$((n + 1))
done
[ -z "$TRIPWIRE_DIR" ] || rm -rf -- "$TRIPWIRE_DIR"
"""

_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


class Tripwire:
    """Armed at construction; ``disarm()`` once what it watches is ended and removed.

    ``marker``: ``NAME=TOKEN`` in the environment of the processes to end; ``directory``: a
    directory of the job's, removed, and processes whose command line names it ended.
    """

    def __init__(self, marker: str = "", directory: Path | None = None) -> None:
        env = {**_ENV, "TRIPWIRE_MARKER": marker, "TRIPWIRE_DIR": str(directory or "")}
        # Its own session: what kills train's process group (a CI job's timeout) must not kill it.
        self._proc = subprocess.Popen(["/bin/sh", "-c", SCRIPT, "tripwire"], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                      start_new_session=True, close_fds=True)
        # Whoever drops it without disarming it is done with what it watches (train disarms at the end).
        self._finalizer = weakref.finalize(self, _disarm, self._proc)

    def disarm(self) -> None:
        """What it watches is gone: let the tripwire go without it looking (once; again is a no-op)."""
        self._finalizer()


def _disarm(proc: subprocess.Popen[bytes]) -> None:
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
