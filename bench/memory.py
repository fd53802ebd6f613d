"""Memory: the supervisor's own RSS while the script runs, ours vs the reference's `train`.

Target: ours < 15 MB (issue 24; the reference holds about 53 MB).
``--before REV``: also the toolkit of git revision REV (a detached worktree on PYTHONPATH; ours then
runs with this checkout's src on PYTHONPATH alike).
Usage: .venv/bin/python bench/memory.py [--before REV]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from common import OURS, REFERENCE, REPO, before_tree, env_for, have_reference, make_tree

SCRIPT = "import time\nopen('started', 'w').close()\ntime.sleep(3)\n"


def peak_rss_mb(cmd: list[str], tree: Path, pythonpath: Path | None = None) -> float:
    env = env_for(tree) if pythonpath is None else {**env_for(tree), "PYTHONPATH": str(pythonpath)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    supervisor = psutil.Process(proc.pid)
    started = tree / "code" / "started"
    peak = 0
    while proc.poll() is None:
        try:
            if started.exists():
                peak = max(peak, supervisor.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.05)
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", help="a git revision whose toolkit is measured too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, before_tree(args.before, Path(tmp) / "before") as before_src:
        ours = peak_rss_mb([str(OURS)], make_tree(Path(tmp) / "ours", SCRIPT),
                           None if before_src is None else REPO / "src")
        print(f"supervisor RSS while the script runs: ours {ours:5.1f} MB (target < 15)")
        if before_src is not None:
            before = peak_rss_mb([str(OURS)], make_tree(Path(tmp) / "before-job", SCRIPT), before_src)
            print(f"                                      before ({args.before}) {before:5.1f} MB")
        if have_reference():
            ref = peak_rss_mb([str(REFERENCE)], make_tree(Path(tmp) / "ref", SCRIPT))
            print(f"                                      reference {ref:5.1f} MB")


if __name__ == "__main__":
    main()
