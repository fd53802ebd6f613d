"""MPI's launch over ssh as hosts grow: the toolkit before and after tree spawn, and a bare mpirun, side by side.

For each N (default 8 and 16) and each round, interleaved, an MPI job of N hosts x 1 rank (mpi4py allreduce):

- ``ours``: this checkout's toolkit through ``run_local`` (tree spawn: every host holds its own client key);
- ``before``: the same job with the toolkit of git revision ``--before`` (default ``main``) on the hosts'
  PYTHONPATH (a detached worktree, its native parts built in place): mpirun from one host
  (``plm_rsh_no_tree_spawn 1``);
- ``bare``: a bare ``mpirun`` with Open MPI's default tree spawn on a cluster prepared in advance (code in
  place, sshd up, one shared key, no connection left open), the options our runner passes otherwise;
- ``bare, no tree``: the same with ``plm_rsh_no_tree_spawn 1``, what ``before`` passes.

Wall time from the hosts being up to the last host's exit (ours, before) or mpirun's run in the first
host (bare), and the CPU time of everything each started, per host (``common.CpuMeter``): on a 2-core
machine shared with other work, wall time moves with the load, CPU time much less.  Medians over rounds.

Needs root, Open MPI 4, openssh-server, mpi4py.  Usage:
.venv/bin/python bench/tree_spawn.py [--rounds R] [--before REV] [--radix K] [N ...]
(``--radix K``: one more line, ours with ``routed_radix K``, so that a tree forms below 65 hosts.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from common import PYTHON, CpuMeter, LocalRun, before_tree
from mpi_job import ALLREDUCE, prepare
from scale import bare_retried

from training_toolkit.local.launcher import LocalJob
from training_toolkit.local.netns import NamespaceCluster, leftovers


def hosts(n: int) -> tuple[str, ...]:
    return tuple(f"algo-{i}" for i in range(1, n + 1))


def mpi_job(src: Path, n: int, env: dict[str, str] | None = None, custom: str | None = None) -> LocalJob:
    hps = {"sagemaker_program": json.dumps("allreduce.py"), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "1"}
    if custom:
        hps["sagemaker_mpi_custom_mpi_options"] = json.dumps(custom)
    return LocalJob(hosts=hosts(n), hyperparameters=hps, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "300", **(env or {})})


def without_tree_option(mpirun: list[str]) -> list[str]:
    """The prepared bare line without ``--mca plm_rsh_no_tree_spawn 1``: Open MPI's default, tree spawn."""
    i = mpirun.index("plm_rsh_no_tree_spawn")
    return mpirun[:i - 1] + mpirun[i + 2:]


def build_native(tree: Path) -> None:
    """The native parts of the 'before' worktree, built in place (the hosts' toolkit needs its rank program)."""
    subprocess.run([str(PYTHON), "setup.py", "-q", "build_ext", "--inplace"], cwd=tree.parent, check=True,
                   capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="*", type=int, default=[8, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default="main")
    parser.add_argument("--radix", type=int)
    args = parser.parse_args()
    tags: list[str] = []
    left: list[str] = []
    figures: dict[tuple[int, str], list[tuple[float, float | None]]] = {}
    meter = CpuMeter()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-tree-") as tmp, before_tree(args.before, Path(tmp) / "before") as old:
            assert old is not None
            build_native(old)
            src = Path(tmp) / "src"
            src.mkdir()
            (src / "allreduce.py").write_text(ALLREDUCE)
            for n in args.sizes:
                prepared = NamespaceCluster(hosts(n), Path(tmp) / f"prepared-{n}")
                try:
                    prepared.start()
                    no_tree = prepare(prepared, src)
                    tree = without_tree_option(no_tree)
                    for r in range(args.rounds):
                        runs = [("ours", {}, None), (f"before ({args.before})", {"PYTHONPATH": str(old)}, None)]
                        if args.radix:
                            runs.append((f"ours, routed_radix {args.radix}", {}, f"--mca routed_radix {args.radix}"))
                        for label, env, custom in runs:
                            at_up: list[float | None] = []
                            run = LocalRun(mpi_job(src, n, env, custom), Path(tmp) / f"{label[:4]}-{n}-{r}", tags,
                                           timeout_s=600, before_start=lambda _c, at=at_up: at.append(meter.seconds()))
                            cpu = None if at_up[0] is None else meter.seconds() - at_up[0]
                            run.check(f"{label} on {n} hosts")
                            figures.setdefault((n, label), []).append((run.last_exit - run.hosts_up, cpu))
                        for label, line in (("bare (tree spawn)", tree), ("bare, no tree", no_tree)):
                            before = meter.seconds()
                            wall = bare_retried(prepared, line)  # fresh logins at once: may fail to start (scale.py)
                            cpu = None if before is None else meter.seconds() - before
                            figures.setdefault((n, label), []).append((wall, cpu))
                        print(f"N={n} round {r + 1}: " + ", ".join(
                            f"{label} {samples[-1][0]:.2f} s" + (f" ({samples[-1][1] / n * 1000:.0f} ms CPU per host)"
                                                                  if samples[-1][1] is not None else "")
                            for (m, label), samples in figures.items() if m == n), flush=True)
                finally:
                    prepared.close()
                    left += prepared.leftovers()
    finally:
        meter.close()
        table(figures)
    left += [item for tag in tags for item in leftovers(tag)]
    print("nothing left running" if not left else f"LEFT BEHIND: {left}")
    if left:
        raise SystemExit(1)


def table(figures: dict[tuple[int, str], list[tuple[float, float | None]]]) -> None:
    """The medians of every size measured so far (also when a later size failed)."""
    print("\n| hosts | run | wall (median) | wall, each round | CPU per host (median) | ours - this, wall per host |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (n, label), samples in figures.items():
        wall = statistics.median(s[0] for s in samples)
        cpus = [s[1] for s in samples if s[1] is not None]
        cpu = f"{statistics.median(cpus) / n * 1000:.0f} ms" if cpus else "n/a"
        ours = statistics.median(s[0] for s in figures.get((n, "ours"), samples))
        print(f"| {n} | {label} | {wall:.2f} s | {', '.join(f'{s[0]:.2f}' for s in samples)} | {cpu} "
              f"| {(ours - wall) / n * 1000:+.0f} ms |")


if __name__ == "__main__":
    main()
