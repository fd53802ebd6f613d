"""The one flow from what a container is given to the job it runs: settings, platform, view, JobSpec, plan.

``train`` (``cli.run``) and ``training-toolkit plan`` (``cli.show_plan``) both go through the
three steps here, in order; ``run`` then does what ``plan`` only shows (waits for the platform,
writes ``/opt/ml``, fetches the code, starts the runner).  Nothing here writes, starts or
fetches, so what ``plan`` prints is what ``run`` runs: the JobSpec is built from the view's
documents in both, never written and parsed back.

    start = flow.start(environ, ...)   # the settings (secrets out of the environment), the platform, its facts
    view = flow.view(start)            # the platform's view of the job
    job = flow.job(start, view)        # the JobSpec and the LaunchPlan

The steps are separate because ``run`` reports through the platform whatever step failed: the
platform once known, the view once made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from training_toolkit.config import settings
from training_toolkit.core.log import log
from training_toolkit.core.paths import Paths
from training_toolkit.config.settings import Settings


class Start(NamedTuple):
    """The settings and the platform: what every later step reads."""

    paths: Paths
    config: Settings
    environ: dict[str, str]  # without the secrets
    platform: Any  # platforms.Platform
    facts: Any  # platforms.view.Facts


class Job(NamedTuple):
    """What a host runs: the settings as the platform's view changes them, the JobSpec and its plan."""

    config: Settings
    environ: dict[str, str]  # without the variables the view says describe train's own task
    spec: Any  # job.JobSpec
    launch: Any  # plan.LaunchPlan


def start(environ: Mapping[str, str], *, read: Callable[[str], bytes | None], base_dir: str | None = None,
          grace_s: float | None = None, platform: str | None = None) -> Start:
    """Parse the settings, take the secrets out of the environment (the one point), find the platform."""
    from training_toolkit import platforms
    from training_toolkit.core import hardware

    config = settings.parse(environ, read=read, base_dir=base_dir, grace_s=grace_s, platform=platform)
    environ = settings.without_secrets(environ)
    for name in settings.unknown_variables(environ):
        guess = settings.meant(name)
        hint = f"did you mean {guess}?" if guess else "see `training-toolkit --help`"
        log(f"warning: {name} is no setting of the toolkit; ignored ({hint})")
    paths = Paths.at(config.base_dir)
    facts = platforms.gather(environ, paths, config, hardware.probe(config.num_gpus))
    return Start(paths, config, environ, platforms.choose(config.platform, facts), facts)


def view(begun: Start):
    """The platform's view of the job (pure given the facts)."""
    return begun.platform.view(begun.facts)


def job(begun: Start, seen) -> Job:
    """The JobSpec and plan for ``seen`` (pure): from the view's documents, or ``/opt/ml`` where the platform gave it."""
    from training_toolkit.job import spec as jobs
    from training_toolkit.job import plan
    from training_toolkit.platforms.opt_ml import documents

    environ = without(begun.environ, seen.unset)
    config = settings.override(begun.config, seen.overrides)
    hardware = with_gpus(begun.facts.hardware, config)
    files = documents(seen)
    if files:
        spec = jobs.build_job(begun.paths, files["hyperparameters.json"], files["resourceconfig.json"],
                              files["inputdataconfig.json"], environ, hardware)
    else:
        spec = jobs.load_job(begun.paths, environ, hardware)
    return Job(config, environ, spec, plan.make_plan(spec))


def with_gpus(hardware, config: Settings):
    """The probed hardware with the GPU count the settings give (the job's, else the platform's), if any."""
    return hardware if config.num_gpus is None else hardware._replace(num_gpus=config.num_gpus)


def without(environ: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """``environ`` without the variables a platform said describe train's own task (no child may take them)."""
    return {k: v for k, v in environ.items() if k not in names} if names else dict(environ)
