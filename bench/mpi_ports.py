"""An MPI job with an outsider holding a connection to every port it opens: the listener guard's figures (issue 17).

3 local hosts x 1 process, Open MPI 4, rounds interleaved (after = this tree, before = git revision REV
on the hosts' PYTHONPATH, extracted with ``git archive``):

1. wall time of an mpi4py allreduce job (``run_local``, from the call to the last host's exit), after
   and before: what the guard costs.
2. the job's end with an outsider (test/helpers/outsider.py): every rank waits until the outsider
   has tried every listener of every host (hold a connection, one byte sent, and garbage), then
   leaves MPI while the outsider holds its connections HOLD_S more.  Figure: from the last rank's
   stamp (written just before ``MPI_Finalize``) to the last host's exit, after and before, and the
   same job with no outsider (the job's own end).  Target: after, with the outsider <= no outsider + 1 s.

With ``--no-net-admin`` every host's ``train`` runs without CAP_NET_ADMIN (as in a Docker or podman
container: the guard cannot attach filters and only cuts), and the two sides are this tree with the
accept() shim and without it (``TRAINING_TOOLKIT_NETSHIM=off``) instead of after and before.

Needs root, Open MPI, openssh-server and mpi4py in the toolkit's venv.
Usage: .venv/bin/python bench/mpi_ports.py [--before REV | --no-net-admin] [--rounds N]   (default: REV f3723e3, 3 rounds)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, LocalRun

sys.path.insert(0, str(REPO / "test"))
from helpers.outsider import mpi_host_ready, start_attack, stop_attack  # noqa: E402
from helpers.paths import FIXTURES  # noqa: E402
from training_toolkit.local.launcher import LocalJob, default_train  # noqa: E402
from training_toolkit.local.netns import leftovers  # noqa: E402

HOSTS = ("algo-1", "algo-2", "algo-3")
HOLD_S = 15.0
NO_NET_ADMIN = ("setpriv", "--bounding-set", "-net_admin", "--")  # what docker's and podman's defaults leave out
ALLREDUCE = """\
from mpi4py import MPI
comm = MPI.COMM_WORLD
assert comm.allreduce(comm.Get_rank() + 1) == comm.Get_size() * (comm.Get_size() + 1) // 2
"""


def job(src: Path, entry: str, env: dict[str, str], outsider: bool, **hps) -> LocalJob:
    values = {"sagemaker_program": json.dumps(entry), "sagemaker_submit_directory": json.dumps(str(src)),
              "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "1",
              **{k: json.dumps(v) for k, v in hps.items()}}
    env = dict(env)
    train = (*NO_NET_ADMIN, *default_train()) if env.pop("NO_NET_ADMIN", None) else ()
    return LocalJob(hosts=HOSTS, hyperparameters=values, env=env, outsiders=("stranger",) if outsider else (),
                    train=train)


def wall(src: Path, env: dict[str, str], workdir: Path, tags: list[str]) -> float:
    run = LocalRun(job(src, "allreduce.py", env, False), workdir, tags, timeout_s=120)
    run.check("allreduce")
    return run.last_exit - run.started


def end_after_last_rank(src: Path, env: dict[str, str], workdir: Path, tags: list[str], outsider: bool) -> float:
    until = workdir.parent / f"{workdir.name}-until.json"
    if not outsider:
        until.write_text("{}")
    attack: dict = {}

    def attack_it(cluster) -> None:
        if outsider:
            start_attack(cluster, HOSTS, lambda ports: mpi_host_ready(ports, True), workdir.parent, until, HOLD_S,
                         attack)

    try:
        run = LocalRun(job(src, "hold_until.py", env, outsider, until=str(until)), workdir, tags, timeout_s=150,
                       before_start=attack_it)
    finally:
        stop_attack(attack)
    run.check("hold_until")
    if "error" in attack:
        raise SystemExit(attack["error"])
    stamps = [json.loads(f.read_text())["exited_at"] for r in run.results for f in r.model_dir.glob("rank-*.json")]
    return run.last_exit - max(stamps)


def stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    return f"median {ordered[len(ordered) // 2]:6.2f} s  (min {ordered[0]:.2f}, max {ordered[-1]:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="f3723e3", help="the git revision without the guard")
    parser.add_argument("--no-net-admin", action="store_true",
                        help="hosts without CAP_NET_ADMIN; compare the accept() shim on and off")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tags: list[str] = []
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ports-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "allreduce.py").write_text(ALLREDUCE)
        (src / "hold_until.py").write_text((FIXTURES / "hold_until.py").read_text())
        if args.no_net_admin:  # NO_NET_ADMIN is the bench's own mark, taken out of the hosts' environment by job()
            trees = {"no CAP_NET_ADMIN, shim on": {"NO_NET_ADMIN": "1"},
                     "no CAP_NET_ADMIN, shim off": {"NO_NET_ADMIN": "1", "TRAINING_TOOLKIT_NETSHIM": "off"}}
        else:
            before = Path(tmp) / "before"
            before.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "src"], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
            trees = {"after": {}, f"before ({args.before})": {"PYTHONPATH": str(before / "src")}}
        for i in range(args.rounds):
            for label, env in trees.items():
                figures.setdefault(f"allreduce wall, {label}", []).append(
                    wall(src, env, Path(tmp) / f"wall-{label[-7:].replace(' ', '')}-{i}", tags))
                for outsider in (False, True):
                    name = f"last rank to last exit, {label}, {'outsider holding every port' if outsider else 'no outsider'}"
                    figures.setdefault(name, []).append(end_after_last_rank(
                        src, env, Path(tmp) / f"end-{label[-7:].replace(' ', '')}-{outsider}-{i}", tags, outsider))
            print(f"round {i + 1}/{args.rounds}: " + "; ".join(f"{k}: {v[-1]:.2f} s" for k, v in figures.items()),
                  flush=True)
    left = [item for tag in tags for item in leftovers(tag)]
    print(f"MPI job on {len(HOSTS)} local hosts x 1 process, {args.rounds} interleaved rounds "
          f"(outsider holds {HOLD_S:g} s after the ranks are let go):")
    for name, samples in figures.items():
        print(f"  {name:75s} {stats(samples)}")
    if left:
        raise SystemExit(f"left behind: {left}")
    print("  nothing left running (namespaces, processes, mounts)")


if __name__ == "__main__":
    main()
