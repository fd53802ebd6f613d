"""Memory: the supervisor's own RSS while the script runs, ours vs the reference's `train`.

Target: ours <= 25 MB (the reference holds about 55 MB).   Usage: .venv/bin/python bench/memory.py
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from common import OURS, REFERENCE, env_for, have_reference, make_tree

SCRIPT = "import time\nopen('started', 'w').close()\ntime.sleep(3)\n"


def peak_rss_mb(cmd: list[str], tree: Path) -> float:
    proc = subprocess.Popen(cmd, env=env_for(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    with tempfile.TemporaryDirectory() as tmp:
        ours = peak_rss_mb([str(OURS)], make_tree(Path(tmp) / "ours", SCRIPT))
        print(f"supervisor RSS while the script runs: ours {ours:5.1f} MB (target <= 25)")
        if have_reference():
            ref = peak_rss_mb([str(REFERENCE)], make_tree(Path(tmp) / "ref", SCRIPT))
            print(f"                                      reference {ref:5.1f} MB")


if __name__ == "__main__":
    main()
