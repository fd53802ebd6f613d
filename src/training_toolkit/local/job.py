"""What both local launchers share: the job, each host's ``/opt/ml`` tree, and each host's result.

The namespace launcher (``launcher.py``) and the container launcher
(``container_launcher.py``) differ only in how a host is made; the job they run,
the tree a host's ``train`` reads and what is reported back are the same.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from training_toolkit.core.paths import Paths
from training_toolkit.platforms.opt_ml import FILE_CHANNEL, resource_config as view_resource_config, write_view
from training_toolkit.platforms.view import JobView

#: The interface the hosts' resourceconfig names: a namespace's veth, a container's first interface.
INTERFACE = "eth0"


@dataclass(frozen=True)
class LocalJob:
    """A job to run on local hosts.  ``hyperparameters`` are the raw strings of hyperparameters.json."""

    hosts: Sequence[str]
    hyperparameters: Mapping[str, str]
    channels: Mapping[str, Path] = field(default_factory=dict)  # channel -> local directory
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for every host's train
    host_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # per host, on top of env
    instance_groups: Sequence[Mapping] = ()
    start_hosts: Sequence[str] | None = None  # hosts whose train starts (default: all)
    train: Sequence[str] = ()  # the command each host runs (default: our train)
    platform_secret: bool = True  # give every host a fresh job secret, as a platform may (SageMaker does not)
    outsiders: Sequence[str] = ()  # namespaces on the job's network that are not hosts of the job (for tests)


@dataclass(frozen=True)
class HostResult:
    host: str
    exit_code: int | None  # None: still running at the timeout, or never started
    success: bool
    failure: str | None
    opt_ml: Path
    ended_at: float | None  # time.monotonic() when its train ended
    survivors: tuple[str, ...] = ()  # processes still in the host once its train ended (should be none)

    @property
    def model_dir(self) -> Path:
        return Paths(self.opt_ml).model_dir


def view(job: LocalJob, host: str, interface: str | None = INTERFACE) -> JobView:
    """What a local launcher, as a platform, gives ``host`` (pure): the job's view, laid out by ``write_view``."""
    return JobView("local", tuple(job.hosts), host, interface, dict(job.hyperparameters),
                   input_data_config(list(job.channels)), instance_groups=tuple(job.instance_groups))


def resource_config(job: LocalJob, host: str, interface: str | None = INTERFACE) -> dict:
    """resourceconfig.json of ``host`` (pure); ``interface`` None leaves the name out, as SageMaker's local mode does."""
    return view_resource_config(view(job, host, interface))


def input_data_config(channels: Sequence[str]) -> dict:
    """inputdataconfig.json for local channels (pure): every channel a File-mode, replicated one."""
    return {name: dict(FILE_CHANNEL) for name in channels}


def host_tree(opt_ml: Path, job: LocalJob, host: str, *, copy_channels: bool = True,
              interface: str | None = INTERFACE) -> None:
    """Lay out one host's /opt/ml (config, data) as a platform would.

    ``copy_channels`` False leaves ``input/data/NAME`` empty: the container launcher mounts the
    channel's directory there instead of copying it.  ``interface`` None writes no interface name
    in resourceconfig.json, as SageMaker's local mode does.
    """
    write_view(Paths(opt_ml), view(job, host, interface))
    for name, source in job.channels.items():
        target = Paths(opt_ml).channel_dir(name)
        if copy_channels:
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            target.mkdir(parents=True, exist_ok=True)


def read_result(host: str, opt_ml: Path, exit_code: int | None, ended_at: float | None,
                survivors: Sequence[str] = ()) -> HostResult:
    """A host's result from its exit and the verdict files its ``train`` left in ``opt_ml``."""
    paths = Paths(opt_ml)
    failure_file = paths.failure_file
    return HostResult(
        host=host,
        exit_code=exit_code,
        success=paths.success_file.exists(),
        failure=failure_file.read_text(errors="replace") if failure_file.exists() else None,
        opt_ml=opt_ml,
        ended_at=ended_at,
        survivors=tuple(survivors),
    )


def lost_hosts(results: Sequence[HostResult]) -> list[str]:
    """Hosts whose ``train`` ended without a verdict (no success or failure file): killed whole, as a node dies."""
    return [r.host for r in results if r.exit_code is not None and not r.success and r.failure is None]


def job_exit_code(results: Sequence[HostResult]) -> int:
    """The job's verdict as one exit code: the code of the hosts that gave a verdict, else 1.

    A lost host (``lost_hosts``) gave none: the job went on without it, and its verdict is the
    others'.  Hosts whose verdicts differ (a lead cut off from the others ends alone, docs/resilience.md,
    "When the lead is lost"): the code more than half of them give.  1 when a host did not end (still
    running at the timeout, or never started), when no host gave a verdict, or when no code has a majority.
    """
    if any(r.exit_code is None for r in results):
        return 1
    lost = set(lost_hosts(results))
    codes = [r.exit_code for r in results if r.host not in lost]
    for code in set(codes):
        if codes.count(code) * 2 > len(codes):
            return code  # type: ignore[return-value]
    return 1


def summary_lines(results: Sequence[HostResult]) -> list[str]:
    """One line per host: its exit and the first line of its verdict."""
    lines = []
    if lost := lost_hosts(results):
        lines.append(f"  lost on the way (no verdict): {', '.join(lost)}")
    for r in results:
        verdict = "success" if r.success else (r.failure or "no verdict").splitlines()[0]
        code = "did not end" if r.exit_code is None else f"exit {r.exit_code}"
        lines.append(f"  {r.host}: {code}: {verdict}")
    return lines
