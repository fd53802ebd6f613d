"""Helpers for tests on local clusters: jobs from fixture scripts, and checks that nothing survives."""

from __future__ import annotations

import json
import os
import shutil
import sys
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
    """Run on a local cluster; assert no host left a process behind when its train ended."""
    results = run_local(job, tmp_path / "cluster", environ=os.environ, timeout_s=timeout_s, out=sys.stdout.buffer, **kw)
    for r in results:
        assert not r.survivors, f"{r.host}: processes survived its train: {r.survivors}"
    leftovers = ours_running()
    assert not leftovers, f"processes of the job survived: {leftovers}"
    return results
