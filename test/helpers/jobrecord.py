"""Reading a host's part of the job's record and its summary line, as a user would (record/schema.py, summary.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from training_toolkit.core.paths import Paths
from training_toolkit.record import schema, summary


# the record's stamps are rounded to the millisecond (schema.entry): one may read up to half of one before, or
# after, the instant it stands for
STAMP_S = 0.0005


def record_file(opt_ml: Path, host: str) -> Path:
    """Where ``host`` keeps its record under its ``/opt/ml``: made at its first entry, once it joined the job."""
    return schema.record_path(Paths(opt_ml).output_data_dir, host)


def record_at(opt_ml: Path, host: str) -> list[dict]:
    return schema.read(record_file(opt_ml, host))


def cost_at(opt_ml: Path, host: str) -> dict:
    return json.loads(schema.cost_path(Paths(opt_ml).output_data_dir, host).read_text())


def of_kind(entries: list[dict], kind: str) -> list[dict]:
    return [item for item in entries if item["kind"] == kind]


def summary_lines(text: str) -> list[str]:
    """Every summary line in a log (a host's prefix before it, if any, left out)."""
    return [line[line.index("training-toolkit: summary:"):] for line in text.splitlines()
            if "training-toolkit: summary:" in line]


def metrics(line: str) -> dict[str, str]:
    """The figures a SageMaker metric definition reads from the line, with the documented regexes."""
    return {name: match.group(1) for name, regex in summary.METRICS.items() if (match := re.search(regex, line))}


def wall(monotonic_at: float) -> float:
    """A ``time.monotonic()`` reading of this process as wall time (what the record's ``t`` is)."""
    return time.time() - (time.monotonic() - monotonic_at)
