"""What every runner is given, and how a supervised script's end becomes an Outcome."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from training_toolkit.errors import ToolkitError
from training_toolkit.job import JobSpec
from training_toolkit.plan import LaunchPlan
from training_toolkit.process import ExitStatus, Supervised
from training_toolkit.report import Outcome, summary_line
from training_toolkit.settings import Settings


class RunContext(NamedTuple):
    job: JobSpec
    plan: LaunchPlan
    settings: Settings  # parsed once at the start: runners read settings here, never from ``environ``
    environ: Mapping[str, str]  # the toolkit's own environment, as read at start (for its children)
    script_env: Mapping[str, str]  # the user script's environment (contract applied)
    argv: tuple[str, ...]  # the user's command with its arguments
    code_dir: Path
    python: str
    setup_error: ToolkitError | None = None  # this host cannot take part (its code did not install): the
    #                                          agent joins the job to say so, as a failure of its setup
    first_attempt: int = 0  # the platform's word on restarts (JobSet's restart-attempt): the job's attempts start there


    @property
    def grace_s(self) -> float:
        return self.settings.grace_s


def with_hosts(ctx: RunContext, hosts: tuple[str, ...]) -> RunContext:
    """``ctx`` for the job's hosts as the first host gave them, its resource config in ``/opt/ml`` rewritten to match.

    Everything a rank sees (``SM_HOSTS``, ``SM_TRAINING_ENV``, ``SM_RESOURCE_CONFIG``, the file) and
    everything that admits or addresses peers (the plan's hosts: the shim, sshd's ``from=``, the guard)
    then follows the first host's membership.
    """
    from training_toolkit import contract, job, plan

    spec = job.with_hosts(ctx.job, hosts)
    if spec is ctx.job:
        return ctx
    _write_json(spec.paths.resource_config_file, dict(spec.resource.raw))
    return ctx._replace(job=spec, plan=plan.make_plan(spec), script_env=contract.script_environment(spec, ctx.environ))


def _write_json(path: Path, value: Mapping) -> None:
    import json
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)


def outcome_of(child: Supervised, status: ExitStatus, label: str = "", what: str | None = None) -> Outcome:
    """A failed process's outcome names how it ended and its last stderr line."""
    if status.ok:
        return Outcome(0)
    child.drain()  # the exit can be seen before the relay has read the last stderr lines
    tail = tuple(child.tail.lines(100))
    prefix = f"{label}: " if label else ""
    description = f"{prefix}{what or _program(child.argv)} {status.describe()}"
    return Outcome(status.exit_code, summary_line(description, tail), tuple(child.argv), tail)


def _program(argv: list[str]) -> str:
    if len(argv) >= 3 and argv[1] == "-m":
        return f"python -m {argv[2]}"
    if len(argv) >= 2 and Path(argv[0]).name.startswith("python"):
        return Path(argv[1]).name
    return Path(argv[0]).name if argv else "script"
