"""Helpers for tests on local clusters: jobs from fixture scripts, and checks that nothing survives."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from helpers.paths import FIXTURES
from training_toolkit.supervise import procfs
from training_toolkit.local.launcher import HostResult, LocalJob, run_local


def source_dir(tmp_path: Path, *scripts: str) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name in scripts:
        shutil.copy(FIXTURES / name, src / name)
    return src


def hps(program: str, src: Path, **extra) -> dict[str, str]:
    values = {"sagemaker_program": json.dumps(program), "sagemaker_submit_directory": json.dumps(str(src))}
    values.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in extra.items()})
    return values


def rank_files(results: list[HostResult], pattern: str = "rank-*.json") -> dict[int, dict]:
    """What each rank wrote to its host's model dir, by rank, with the host it was found on as ``host``."""
    ranks = {}
    for r in results:
        for f in r.model_dir.glob(pattern):
            info = json.loads(f.read_text())
            info["host"] = r.host
            ranks[info["rank"]] = info
    return ranks


def ours_running() -> list[str]:
    """Processes still below this test process (the launcher's hosts and whatever they started)."""
    return [f"{p.pid} {line[:120]}" for p in procfs.descendants(os.getpid())
            if not p.zombie and (line := procfs.cmdline(p.pid)) is not None]


def run(job: LocalJob, tmp_path: Path, timeout_s: float = 120, **kw) -> list[HostResult]:
    """Run on a local cluster; assert no host left a process behind when its train ended.  ``out``: where the hosts'
    prefixed lines go (the test's stdout; a ``Tee`` to watch them while the job runs)."""
    out = kw.pop("out", sys.stdout.buffer)
    results = run_local(job, tmp_path / "cluster", environ=os.environ, timeout_s=timeout_s, out=out, **kw)
    for r in results:
        assert not r.survivors, f"{r.host}: processes survived its train: {r.survivors}"
    leftovers = ours_running()
    assert not leftovers, f"processes of the job survived: {leftovers}"
    return results


class Tee:
    """The hosts' prefixed output to the test's stdout, and kept: a thread of the test waits for a line
    (``wait_for``) to act at that point of the job (a host's own words, where no file marks it)."""

    def __init__(self) -> None:
        self._seen = bytearray()
        self._changed = threading.Condition()

    def write(self, data: bytes) -> int:
        sys.stdout.buffer.write(data)
        with self._changed:
            self._seen += data
            self._changed.notify_all()
        return len(data)

    def flush(self) -> None:
        sys.stdout.buffer.flush()

    def text(self) -> str:
        """Everything written so far."""
        with self._changed:
            return self._seen.decode(errors="replace")

    def wait_for(self, *lines: str, timeout_s: float = 120.0) -> None:
        """Until every one of ``lines`` was written (each a part of a line)."""
        end = time.monotonic() + timeout_s
        with self._changed:
            while not all(line.encode() in self._seen for line in lines):
                left = end - time.monotonic()
                assert left > 0, f"not said within {timeout_s:g} s: {lines}"
                self._changed.wait(left)
