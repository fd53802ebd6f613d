"""``training-toolkit local``: run a job on N hosts of this machine: network namespaces (root), or containers (``--image``)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from training_toolkit.core import names
from training_toolkit.core.errors import EXIT_USAGE, ToolkitError
from training_toolkit.local.containers import CODE_DIR, host_names
from training_toolkit.local.job import job_exit_code, summary_lines
from training_toolkit.local.run_loop import DEFAULT_STOP_GRACE_S, DEFAULT_TIMEOUT_S
from training_toolkit.core.log import log

NONE = "none"
TEMP_PREFIX = "training-toolkit-local-"  # the default workdir: a new directory under the temp dir
# What `train` can run: the distributions with a runner, by the names of names.DISTRIBUTIONS.
DISTRIBUTIONS = {d.name: d for d in names.DISTRIBUTIONS if d.runner}


def job_hyperparameters(entry_point: str, source: Path | PurePosixPath, distribution: str,
                        processes_per_host: int | None) -> dict[str, str]:
    """hyperparameters.json's raw strings for a job run with ``--distribution`` (pure).

    The distribution's own switch, so each host's ``train`` chooses the runner the table names;
    processes per host under the distribution's own parameter.
    """
    hps = {names.PROGRAM: json.dumps(entry_point), names.SUBMIT_DIRECTORY: json.dumps(str(source))}
    if distribution == NONE:
        if processes_per_host:
            raise ValueError("--processes-per-host needs a --distribution")
        return hps
    chosen = DISTRIBUTIONS[distribution]
    hps[chosen.switch] = "true"
    if processes_per_host:
        if chosen.processes_per_host is None:
            raise ValueError(f"--processes-per-host does not apply to {distribution} (one process per host)")
        hps[chosen.processes_per_host] = str(processes_per_host)
    return hps


def _within(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def overlap(source: Path, workdir: Path, channels: dict[str, Path], hosts: Sequence[str]) -> str | None:
    """Why ``--workdir`` cannot be used with these directories (pure; every path absolute, resolved), or None.

    Each host copies the code into its tree under the workdir (``HOST/opt/ml/code``), and ``local``
    each channel (``HOST/opt/ml/input/data/NAME``): a copy whose target is inside its source (a
    workdir inside the code) would copy itself, deeper on every pass, until Python gives up with
    RecursionError; a source inside its target would be copied onto itself.  The code or a
    channel elsewhere in the workdir is fine.
    """
    copies = [("--source", source, ("code",)),
              *((f"--channel {name}", path, ("input", "data", name)) for name, path in channels.items())]
    for flag, path, where in copies:
        if _within(workdir, path):
            return (f"--workdir {workdir} is inside {flag} {path}: each host copies {flag} into its tree there, "
                    f"which would copy it into itself; give a --workdir outside {path}")
        for host in hosts:
            target = workdir.joinpath(host, "opt", "ml", *where)
            if _within(path, target):
                return (f"{flag} {path} is in host {host}'s copy of it, {target}, under --workdir {workdir}: "
                        "it would be copied onto itself; give another --workdir")
            if _within(target, path):
                return (f"{flag} {path} holds {target}, where host {host} copies it, under --workdir {workdir}: it "
                        "would copy it into itself; give a --workdir outside it")
    return None


def _distributions_help() -> str:
    lines = ["distributions (--distribution NAME: the switch it sets -> the runner `train` chooses):"]
    for name, d in DISTRIBUTIONS.items():
        lines += [f"  {name}: {d.switch} -> {d.runner}", f"      {d.doc}"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="training-toolkit local",
        description="Run a training job on N local hosts, each made of namespaces as a container is (its own "
        "hostname, address, /opt/ml and PID namespace), as a platform would; output is prefixed by host; nothing "
        "of the job outlives local, even killed. Needs root.",
        epilog=_distributions_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--hosts", type=int, default=2, help="number of hosts (algo-1..algo-N), default 2")
    parser.add_argument("--spares", type=int, default=0,
                        help="more hosts after them, waiting as spares: each takes a lost host's seat at the job's "
                             "next restart (sets TRAINING_TOOLKIT_MAX_HOSTS to --hosts; give restarts with --env "
                             "TRAINING_TOOLKIT_MAX_RESTARTS=N; docs/resilience.md)")
    parser.add_argument("--source", required=True, type=Path, help="directory with the training code")
    parser.add_argument("--entry-point", required=True, help="script (or command) in --source to run")
    parser.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                        help="a hyperparameter, as it would appear in hyperparameters.json (repeatable)")
    parser.add_argument("--channel", action="append", default=[], metavar="NAME=DIR",
                        help="a data channel copied to every host's input/data/NAME (repeatable)")
    parser.add_argument("--distribution", choices=[NONE, *DISTRIBUTIONS], default=NONE,
                        help="how the hosts run the job (see below); default none: each host on its own")
    parser.add_argument("--processes-per-host", type=int,
                        help=f"processes per host ({', '.join(n for n, d in DISTRIBUTIONS.items() if d.processes_per_host)}; "
                        "default: GPUs, else 1)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="environment for every host")
    parser.add_argument("--workdir", type=Path, help="where the hosts' /opt/ml trees are kept (default: a new temp dir)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds before the job is stopped (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--stop-grace", type=float, default=DEFAULT_STOP_GRACE_S,
                        help="seconds a stopped job's hosts get between SIGTERM and SIGKILL, each host's train "
                        f"passing them on to its ranks (default {DEFAULT_STOP_GRACE_S:g}); a stop is Ctrl-C or "
                        "SIGTERM to local, or --timeout")
    parser.add_argument("--host-suffix", metavar="SUFFIX",
                        help="name the hosts algo-1-SUFFIX .. (as SageMaker's local mode does), so that jobs' "
                        "container names never clash")
    images = parser.add_argument_group(
        "containers", "with --image, each host is a container of IMAGE on a network of its own, through the "
        "engine that DOCKER_HOST (or /var/run/docker.sock) names: dockerd or `podman system service` "
        "(needs the docker SDK: pip install 'training-toolkit[containers]'); the code is mounted read-only at "
        "/opt/code, each channel read-only at /opt/ml/input/data/NAME")
    images.add_argument("--image", help="run each host in a container of this image (its `train` is run)")
    images.add_argument("--gpus", choices=("auto", "all", "none"), default="auto",
                        help="give the containers the machine's GPUs (a device request for all of them): "
                        "auto (default) when this machine has NVIDIA GPUs, all, or none")
    return parser


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            log(f"local: {flag} expects KEY=VALUE, got {item!r}")
            raise SystemExit(EXIT_USAGE)
        out[key] = value
    return out


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """``training-toolkit local``; ``environ``: the launcher's environment, as ``cli`` read it."""
    from training_toolkit.local.launcher import LocalJob, run_local

    args = build_parser().parse_args(list(argv))
    if args.hosts < 1:
        log("local: --hosts must be at least 1")
        return EXIT_USAGE
    if args.spares < 0:
        log("local: --spares must be at least 0")
        return EXIT_USAGE
    if args.stop_grace < 0:
        log("local: --stop-grace must be at least 0")
        return EXIT_USAGE
    source = args.source.resolve()
    if not (source / args.entry_point).exists():
        log(f"local: {args.entry_point} not found in {source}")
        return EXIT_USAGE
    if args.processes_per_host is not None and args.processes_per_host < 1:
        log("local: --processes-per-host must be at least 1")
        return EXIT_USAGE
    submit = PurePosixPath(CODE_DIR) if args.image else source
    try:
        hps = job_hyperparameters(args.entry_point, submit, args.distribution, args.processes_per_host)
    except ValueError as exc:
        log(f"local: {exc}")
        return EXIT_USAGE
    hps.update(_pairs(args.hp, "--hp"))
    channels = {k: Path(v).resolve() for k, v in _pairs(args.channel, "--channel").items()}
    for name, path in channels.items():
        if not path.is_dir():
            log(f"local: channel {name}: {path} is not a directory")
            return EXIT_USAGE
    hosts = host_names(args.hosts + args.spares, args.host_suffix)
    # checked before anything is made: the default workdir is a new directory under the temp dir
    planned = args.workdir.resolve() if args.workdir else Path(tempfile.gettempdir()).resolve() / f"{TEMP_PREFIX}XXXXXX"
    why = overlap(source, planned, channels, hosts)
    if why:
        log(f"local: {why}" if args.workdir else f"local: {why} (the default --workdir is a new directory there)")
        return EXIT_USAGE
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    env = _pairs(args.env, "--env")
    if args.spares:  # an --env of its own wins
        env = {"TRAINING_TOOLKIT_MAX_HOSTS": str(args.hosts), **env}
    job = LocalJob(hosts=hosts, hyperparameters=hps, channels=channels, env=env)
    try:
        if args.image:
            results = _run_in_containers(job, workdir, args, source, environ)
        else:
            results = run_local(job, workdir, environ=environ, timeout_s=args.timeout, stop_grace_s=args.stop_grace)
    except ToolkitError as exc:  # the hosts could not start (not root, no engine, no image, ...)
        log(f"local: {exc}")
        return exc.exit_code
    print(f"\nhosts' /opt/ml trees are under {workdir}", file=sys.stderr)
    for line in summary_lines(results):
        print(line, file=sys.stderr)
    if _had_a_fault(workdir):
        print(f"the job drawn, its faults and what they cost: training-toolkit timeline {workdir}", file=sys.stderr)
    return job_exit_code(results)


def _had_a_fault(workdir: Path) -> bool:
    """Any host's record under ``workdir`` names a fault (record/timeline.py)."""
    from training_toolkit.record.timeline import find_records

    return any(item["kind"] == "fault" for entries in find_records(workdir).values() for item in entries)


def _run_in_containers(job, workdir: Path, args: argparse.Namespace, source: Path, environ: Mapping[str, str]) -> list:
    from training_toolkit.core import hardware
    from training_toolkit.local.container_launcher import run_containers

    gpus = args.gpus == "all" or (args.gpus == "auto" and hardware.probe().num_gpus > 0)
    run = run_containers(job, workdir, image=args.image, source=source, environ=environ, timeout_s=args.timeout,
                         stop_grace_s=args.stop_grace, gpus=gpus)
    print(f"\nartifacts: {run.model_tar} and {run.output_tar} (merged from every host, as SageMaker's local mode "
          f"leaves them)", file=sys.stderr)
    if run.leftovers:
        log(f"local: left at the engine: {', '.join(run.leftovers)}")
    return run.results
