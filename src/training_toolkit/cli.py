"""Command line: ``train`` (what the platform calls) and ``training-toolkit run|plan|local``.

Every setting is an environment variable (``config/settings.py``: one table, parsed
once at the start), so a platform that can only set variables can still
configure the toolkit; the few flags win over their variables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from training_toolkit.core import errors

from training_toolkit.config import settings
from training_toolkit.core.log import log
from training_toolkit.core.paths import Paths


def _flag_type(field: str):
    """argparse's ``type=`` for a flag that stands for a setting: the setting's own parser."""
    import argparse

    var = settings.variable(field)

    def convert(raw: str):
        try:
            return var.parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, got {raw!r}") from None

    return convert


def _add_job_flags(parser) -> None:
    from training_toolkit.config.settings_help import help_text  # deferred: only a command line with flags builds a parser

    parser.add_argument("--base-dir", type=_flag_type("base_dir"), help=help_text("base_dir"))


def _add_platform_flag(parser) -> None:
    from training_toolkit.config.settings_help import help_text

    parser.add_argument("--platform", type=_flag_type("platform"), help=help_text("platform"))


def _add_grace_flag(parser) -> None:
    from training_toolkit.config.settings_help import help_text

    parser.add_argument("--grace-period", type=_flag_type("grace_s"), metavar="SECONDS", help=help_text("grace_s"))


def build_parser():
    import argparse  # deferred, like every import `train` does not need on its launch path

    import pathlib

    from training_toolkit.config.settings_help import environment_help

    parser = argparse.ArgumentParser(
        prog="training-toolkit",
        description="Run a SageMaker-style training job from /opt/ml on this host.",
        epilog=environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run the job (what `train` does)", description="Run the job described under the base dir.",
                         epilog=environment_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_job_flags(run)
    _add_grace_flag(run)
    _add_platform_flag(run)
    plan = sub.add_parser("plan", help="print what `run` would do, running nothing", description="Print the resolved job, runner, command and environment (secrets redacted), running nothing.")
    _add_job_flags(plan)
    _add_platform_flag(plan)
    plan.add_argument("--json", action="store_true", help="print JSON")
    timeline = sub.add_parser("timeline", help="draw a recorded job: hosts, roles, faults, the time they cost",
                              description="Draw the job whose records are under DIR (a job directory, or local's "
                                          "--workdir): needs the optional extra: pip install 'training-toolkit[timeline]'.")
    timeline.add_argument("directory", metavar="DIR", type=pathlib.Path)
    timeline.add_argument("--output", "-o", type=pathlib.Path, help="the picture (.png, .svg, .pdf; default: DIR/timeline.png)")
    sub.add_parser("local", help="run a job on N local hosts (network namespaces, needs root; or containers with --image); see `local --help`")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["local"]:  # its own parser: every flag after `local` is its own
        from training_toolkit.local.cli import main as local_main

        return local_main(argv[1:], dict(os.environ))
    try:
        return _main(argv)
    except BrokenPipeError:  # `training-toolkit plan | head`
        return 0


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run(args.base_dir, args.grace_period, dict(os.environ), args.platform)
    if args.command == "plan":
        return show_plan(args.base_dir, args.json, dict(os.environ), args.platform)
    if args.command == "timeline":
        from training_toolkit.record import timeline

        return timeline.main(args.directory, args.output)
    build_parser().print_help(sys.stderr)
    return errors.EXIT_USAGE


def train_main(argv: Sequence[str] | None = None) -> int:
    """``train``: what the platform runs in every container."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in ([], ["train"]):  # how platforms call it: skip building a parser on the launch path
        return run(None, None, dict(os.environ))
    import argparse

    from training_toolkit.config.settings_help import environment_help

    parser = argparse.ArgumentParser(prog="train", description="Run the training job described under /opt/ml (the SageMaker entry point).",
                                     epilog=environment_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_job_flags(parser)
    _add_grace_flag(parser)
    _add_platform_flag(parser)
    # SageMaker calls `train` with no arguments; a stray positional (the platform's
    # own "train") is accepted and ignored.
    parser.add_argument("mode", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return run(args.base_dir, args.grace_period, dict(os.environ), args.platform)


def run(base_dir: str | None, grace_s: float | None, environ: dict[str, str], platform: str | None = None) -> int:
    """The one flow (docs/architecture.md): settings, the platform's view, the job, then /opt/ml, the code, the verdict."""
    from training_toolkit import flow

    # The job directory first: a bad setting is a verdict too, and the verdict goes there.
    from training_toolkit.job import report
    paths = Paths.at(settings.value_of("base_dir", environ, base_dir))
    report.clear_verdict(paths)
    found = None  # (platform, facts, view): the platform reports the end even when its view could not be made
    try:
        begun = flow.start(environ, read=_read_bytes, base_dir=base_dir, grace_s=grace_s, platform=platform)
        found = (begun.platform, begun.facts, None)
        view = flow.view(begun)
        found = (begun.platform, begun.facts, view)
        for note in view.notes:
            log(note)
        job = flow.job(begun, view)
        begun.platform.wait(view, job.config)
        from training_toolkit.platforms.opt_ml import write_view

        write_view(paths, view)
        outcome = _run(job, view.restart_attempt)
    except errors.ToolkitError as exc:
        outcome = report.Outcome(exc.exit_code, str(exc))
    except KeyboardInterrupt:
        outcome = report.Outcome(130, "interrupted")
    except Exception as exc:  # noqa: BLE001 - a bug of ours: still a verdict, with the traceback for the report
        import traceback

        traceback.print_exc()
        outcome = report.Outcome(errors.EXIT_INTERNAL, f"training-toolkit internal error: {exc!r}")
    if not outcome.ok:
        log(f"failed: {outcome.reason}")
    report.write_verdict(paths, outcome)
    if found is None:
        found = _platform_despite_bad_settings(paths, environ)
    if found is not None:
        found[0].report_end(found[1], found[2], outcome.exit_code, outcome.reason)
    return outcome.exit_code


def _platform_despite_bad_settings(paths: Paths, environ: Mapping[str, str]):
    """A bad setting is a verdict too: the platform (with every other setting at its default) still reports it."""
    from training_toolkit import platforms
    from training_toolkit.core import hardware

    try:
        config = settings.parse({}, base_dir=str(paths.base))._replace(
            termination_log=settings.value_of("termination_log", environ))
        environ = settings.without_secrets(environ)
        facts = platforms.gather(environ, paths, config, hardware.probe(config.num_gpus))
        return platforms.choose(config.platform, facts), facts, None
    except Exception:  # noqa: BLE001 - nothing more can be told, and the verdict files are written already
        return None


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise errors.ConfigError(path, None, f"cannot be read: {exc.strerror or exc}") from None


def _run(job, first_attempt: int = 0):
    """Fetch the code and hand the job to its runner (the side effects ``plan`` leaves out)."""
    from training_toolkit.job import code
    from training_toolkit.job import contract
    from training_toolkit.agent import loop as agent
    from training_toolkit.supervise.process import become_subreaper
    from training_toolkit.runspec import RunContext

    spec, launch, config, environ = job.spec, job.launch, job.config, job.environ
    python = code.python_for(config.python)
    setup_error, code_dir, argv = None, spec.paths.code_dir, ()
    try:
        code_dir, command = code.prepare(spec, environ, python)
        argv = (*command.argv, *contract.user_args(spec.hyperparameters))
    except errors.CodeError as exc:
        if not launch.multi_host:
            raise
        # the agent joins the job all the same, to tell every host why: a failure of its setup
        setup_error = errors.CodeError(f"{launch.current_host}: {exc}")
    become_subreaper()
    ctx = RunContext(
        job=spec,
        plan=launch,
        settings=config,
        environ=environ,
        script_env=contract.script_environment(spec, environ),
        argv=argv,
        code_dir=code_dir,
        python=python,
        setup_error=setup_error,
        first_attempt=first_attempt,
    )
    from training_toolkit.runners.one_stop import with_one_stop

    return agent.run(ctx, with_one_stop(_runner(launch.runner).spec(ctx), config.one_stop))


def _runner(name: str):
    from training_toolkit.runners import runner

    return runner(name)


def show_plan(base_dir: str | None, as_json: bool, environ: dict[str, str], platform: str | None = None) -> int:
    """What ``run`` would do, from the same flow (``flow``), without its side effects."""
    import json
    import shlex

    from training_toolkit import flow

    from training_toolkit.job import code

    from training_toolkit.job import contract
    from training_toolkit.core.redact import redact

    try:
        begun = flow.start(environ, read=_read_bytes, base_dir=base_dir, platform=platform)
        view = flow.view(begun)
        job = flow.job(begun, view)
        paths, config, environ, spec, launch = begun.paths, job.config, job.environ, job.spec, job.launch
        # a hyperparameter whose name looks secret shows nowhere: its value is left out at the source, so the
        # command, SM_HPS, SM_USER_ARGS, SM_TRAINING_ENV and the ranks' command are computed without it
        spec = spec._replace(hyperparameters=redact(spec.hyperparameters))
        python = code.python_for(config.python)
        entry = _planned_command(spec, python)
        script_env = contract.script_environment(spec, environ)
    except errors.ToolkitError as exc:
        log(str(exc))
        return exc.exit_code
    argv = [*entry, *contract.user_args(spec.hyperparameters)]
    from training_toolkit.runspec import RunContext

    ctx = RunContext(job=spec, plan=launch, settings=config, environ=environ, script_env=script_env, argv=tuple(argv),
                     code_dir=spec.paths.code_dir, python=python)
    try:
        details = _runner(launch.runner).describe(ctx)
    except errors.ToolkitError as exc:
        log(str(exc))
        return exc.exit_code
    shown_env = redact({k: v for k, v in script_env.items() if environ.get(k) != v or k.startswith("SM_")})
    doc = {
        "platform": view.platform,
        "base_dir": str(paths.base),
        "current_host": spec.resource.current_host,
        "hosts": list(spec.resource.hosts),
        "runner": launch.runner,
        "plan_hosts": list(launch.hosts),
        "options": launch.options._asdict(),
        "command": argv,
        **details,
        "environment": dict(sorted(shown_env.items())),
    }
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"platform:     {doc['platform']}")
    print(f"base dir:     {doc['base_dir']}")
    print(f"current host: {doc['current_host']} of {', '.join(doc['hosts'])}")
    print(f"runner:       {launch.runner} on {', '.join(launch.hosts)}")
    for key, value in launch.options._asdict().items():
        print(f"  {key}: {value}")
    print(f"command:      {shlex.join(argv)}")
    for key, value in details.items():
        shown = shlex.join(value) if key == "mpirun" else value if isinstance(value, str) else json.dumps(value)
        print(f"{key}: {shown}")
    print("environment (set or changed by the toolkit; secrets redacted):")
    for key, value in doc["environment"].items():
        print(f"  {key}={value}")
    return 0


def _planned_command(spec, python: str) -> list[str]:
    """The command as it would run, without fetching code: a best guess when the code is not there yet."""
    from training_toolkit.job import code

    try:
        return list(code.entry_command(spec, spec.paths.code_dir, python).argv)
    except errors.CodeError:
        if not spec.entry_point:
            raise
        return [python, spec.entry_point] if spec.entry_point.endswith(".py") else [spec.entry_point]
