"""``python -m training_toolkit.local.reaper JOB_ID``: removes a container job whose launcher died.

A container job's containers belong to the engine, not to the launcher: nothing in the
kernel ends them when ``training-toolkit local --image`` dies.  So the launcher arms a
dead-man switch (``supervise/deadman.py``, the same one ``train`` arms for its processes)
that runs this once the launcher is gone without having said ``done`` (SIGKILL included):
it kills and removes every container and network labelled with the job, says so in one
line, and exits.  Until then only the switch waits (no Python).  Should the switch be
killed too, the next launcher removes the job (its launcher label names a process that is
gone).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``environ`` None: this process's own (what the dead-man switch gave it: the launcher's, DOCKER_HOST included)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m training_toolkit.local.reaper JOB_ID\n")
        return 64
    job_id = args[0]
    from training_toolkit.core.errors import ToolkitError
    from training_toolkit.local import engine
    from training_toolkit.core.log import log

    try:
        client = engine.connect(engine.socket_url(os.environ if environ is None else environ))
        left = engine.leftovers(client, job_id)
        problems = engine.remove_job(client, job_id) if left else []
    except ToolkitError as exc:
        log(f"local: the launcher of job {job_id} died; removing the job failed: {exc}")
        return 1
    if left:
        log(f"local: the launcher of job {job_id} died: removed {', '.join(left)}"
            + (f"; could not remove: {'; '.join(problems)}" if problems else ""))
    return 1 if problems else 0


def command(job_id: str) -> list[str]:
    """What the launcher's dead-man switch runs should the launcher die."""
    return [sys.executable, "-m", "training_toolkit.local.reaper", job_id]


if __name__ == "__main__":
    raise SystemExit(main())
