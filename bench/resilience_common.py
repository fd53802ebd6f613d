"""Shared by the resilience benchmarks: the fixtures' jobs on local hosts, and output with arrival times."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from common import REPO

FIXTURES = REPO / "test" / "fixtures" / "scripts"


class Recorder:
    """The launcher's output, each line with its arrival (monotonic); echoed when ``echo``."""

    def __init__(self, echo: bool = False):
        self.lines: list[tuple[float, bytes]] = []
        self._buf = b""
        self._echo = echo

    def write(self, data: bytes) -> int:
        if self._echo:
            sys.stdout.buffer.write(data)
        self._buf += data
        *done, self._buf = self._buf.split(b"\n")
        now = time.monotonic()
        self.lines += [(now, line) for line in done]
        return len(data)

    def flush(self) -> None:
        sys.stdout.buffer.flush()

    def last(self, marker: bytes) -> float:
        return max(t for t, line in self.lines if marker in line)

    def text(self) -> str:
        return b"\n".join(line for _, line in self.lines).decode(errors="replace")


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
