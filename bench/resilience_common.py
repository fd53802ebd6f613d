"""Shared by the resilience benchmarks: the fixtures' jobs on local hosts, and output with arrival times."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import REPO

sys.path.insert(0, str(REPO / "test"))
from helpers.recorder import Recorder  # noqa: E402,F401 - the benches take it from here

FIXTURES = REPO / "test" / "fixtures" / "scripts"


def source(tmp: Path, *scripts: str) -> Path:
    src = tmp / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name in scripts:
        (src / name).write_text((FIXTURES / name).read_text())
    return src


def hps(program: str, src: Path, **extra) -> dict[str, str]:
    return {"sagemaker_program": json.dumps(program), "sagemaker_submit_directory": json.dumps(str(src)),
            **{k: v if isinstance(v, str) else json.dumps(v) for k, v in extra.items()}}


def stamps(model_dirs, prefix: str) -> list[float]:
    """Wall-clock stamps the fixtures wrote (``started-ATTEMPT-RANK``, ``killed``) in the hosts' model dirs."""
    return [float(f.read_text()) for d in model_dirs for f in Path(d).glob(prefix)]
