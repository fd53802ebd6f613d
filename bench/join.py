"""Start to barrier on a 4-host local cluster: with a platform secret, without one, and under a flood.

A job's start-to-barrier time is from the moment the hosts are up (``before_start``)
to the moment the last host's script starts (each process writes ``time.monotonic()``
first thing; CLOCK_MONOTONIC is system-wide).  The runner is the torch-style launcher
(one process per host, no framework import), so the figure is the toolkit's own: start,
join, barrier.  Runs are interleaved round by round:

- ``after, platform secret``: this checkout, a secret given to every host;
- ``after, no secret``: this checkout, no secret (seats by address, as on SageMaker);
- ``after, no secret, flood``: the same while an outsider namespace on the job's bridge
  opens 1000 connections to the first host's control port during the join window.
  Target: the barrier still passes within 2 s;
- ``before, platform secret`` (with ``--before REV``): the hosts run the toolkit of git
  revision REV (a worktree in a temp dir, on the hosts' PYTHONPATH); target: after within
  noise of before.

Needs root.  Usage: .venv/bin/python bench/join.py [--rounds N] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, STAMP, LocalRun, stamps

from training_toolkit.local.launcher import LocalJob
from training_toolkit.local.netns import leftovers

HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")
FLOOD = """\
import socket, sys, time
master, count, report = sys.argv[1], int(sys.argv[2]), sys.argv[3]
end = time.monotonic() + 60
opened, held, first = 0, [], None
while opened < count and time.monotonic() < end:  # refused until the first host serves, then open, hold, close
    try:
        held.append(socket.create_connection((master, 8950), timeout=2))
        opened += 1
        first = first or time.monotonic()
    except OSError:
        time.sleep(0.002)
    if len(held) >= 200:
        [s.close() for s in held]
        held = []
[s.close() for s in held]
with open(report + ".tmp", "w") as f:
    f.write(f"{opened} {first} {time.monotonic()}")
import os
os.replace(report + ".tmp", report)
"""
# Under the flood, the job lasts until the outsider is done (after the barrier, so the figure is unchanged).
STAMP_AND_WAIT = STAMP + """\
import sys
end = time.monotonic() + 60
while not os.path.exists(sys.argv[-1]) and time.monotonic() < end:
    time.sleep(0.05)
"""


def job(src: Path, *, secret: bool, env: dict | None = None, outsiders=(), until: Path | None = None) -> LocalJob:
    hps = {"sagemaker_program": json.dumps("stamp.py" if until is None else "stamp_and_wait.py"),
           "sagemaker_submit_directory": json.dumps(str(src)), "sagemaker_torch_distributed_enabled": "true"}
    if until is not None:
        hps["until"] = json.dumps(str(until))
    return LocalJob(hosts=HOSTS, hyperparameters=hps, env=env or {}, platform_secret=secret, outsiders=outsiders)


def barrier_s(run: LocalRun) -> float:
    starts = stamps(run.results)
    if len(starts) != len(HOSTS):
        raise SystemExit(f"expected {len(HOSTS)} processes to start, saw {len(starts)}")
    return max(starts) - run.hosts_up


def flooded(src: Path, workdir: Path, tags: list[str]) -> tuple[float, int, float]:
    """(start to barrier, connections the outsider opened, seconds its flood ran before the barrier passed)."""
    report = workdir.parent / f"{workdir.name}.flood"
    proc: dict = {}

    def start_flood(cluster) -> None:
        proc["p"] = cluster.popen("stranger", [sys.executable, "-c", FLOOD, HOSTS[0], "1000", str(report)],
                                  env={"PATH": os.environ["PATH"]})

    run = LocalRun(job(src, secret=False, outsiders=("stranger",), until=report), workdir, tags, before_start=start_flood)
    proc["p"].wait(timeout=60)
    run.check("flood")
    opened, first, _ = report.read_text().split()
    starts = stamps(run.results)
    return barrier_s(run), int(opened), max(starts) - float(first)


def stats(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:7.0f} ms  (min {min(samples) * 1000:.0f}, max {max(samples) * 1000:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", help="a git revision whose toolkit the hosts run for the 'before' figure")
    args = parser.parse_args()
    tags: list[str] = []
    figures: dict[str, list[float]] = {"after, platform secret": [], "after, no secret": [],
                                       "after, no secret, flood": []}
    opened: list[int] = []
    overlap: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "stamp.py").write_text(STAMP)
        (src / "stamp_and_wait.py").write_text(STAMP_AND_WAIT)
        before_env = None
        if args.before:
            tree = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.before],
                           check=True, capture_output=True)
            before_env = {"PYTHONPATH": str(tree / "src")}
            figures[f"before ({args.before}), platform secret"] = []
        try:
            for i in range(args.rounds):
                for label, secret in (("after, platform secret", True), ("after, no secret", False)):
                    run = LocalRun(job(src, secret=secret), Path(tmp) / f"{label}-{i}".replace(" ", "_"), tags)
                    run.check(label)
                    figures[label].append(barrier_s(run))
                if before_env is not None:
                    label = f"before ({args.before}), platform secret"
                    run = LocalRun(job(src, secret=True, env=before_env), Path(tmp) / f"before-{i}", tags)
                    run.check(label)
                    figures[label].append(barrier_s(run))
                seconds, count, during = flooded(src, Path(tmp) / f"flood-{i}", tags)
                figures["after, no secret, flood"].append(seconds)
                opened.append(count)
                overlap.append(during)
                print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in figures.items()),
                      flush=True)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(Path(tmp) / "before")],
                               capture_output=True)
    print(f"start to barrier, {len(HOSTS)} local hosts, {args.rounds} interleaved rounds:")
    for label, samples in figures.items():
        print(f"  {label:40s} {stats(samples)}")
    print(f"  outsider connections opened per flood: {min(opened)}-{max(opened)}, its flood began "
          f"{min(overlap) * 1000:.0f}-{max(overlap) * 1000:.0f} ms before the barrier passed (target: barrier within 2 s)")
    left = [item for tag in tags for item in leftovers(tag)]
    print("  nothing left running" if not left else f"  LEFT BEHIND: {left}")
    if left:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
