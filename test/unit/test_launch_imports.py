"""What a single-host ``train`` imports: nothing a job of one host does not use (docs/benchmarks.md).

The listener guard (cluster/guard.py: dataclasses, inspect, socket) is imported where a runner names
listeners to guard, and the channel's ``secrets`` (hmac, hashlib, random) where a job has peers:
each cost the launch of every single-host job milliseconds and megabytes it never used.  The agent
loads the channel's code (membership, secret, clocks), the barrier's rules, the roster, the other hosts'
rules and the progress watch only where a job has peers, several hosts or a stall watch.
"""

from __future__ import annotations

import pytest
import json
import os
import re
import subprocess
import sys
from pathlib import Path

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

NOT_FOR_ONE_HOST = {"training_toolkit.cluster.guard", "training_toolkit.cluster.listeners",
                    "training_toolkit.cluster.sockfilter", "training_toolkit.cluster.server",
                    "training_toolkit.cluster.client", "training_toolkit.cluster.membership",
                    "training_toolkit.cluster.timing", "training_toolkit.agent.roster",
                    "training_toolkit.agent.barrier", "training_toolkit.agent.follow", "training_toolkit.agent.progress",
                    "dataclasses", "inspect", "secrets", "hmac", "socket",
                    "tarfile", "tempfile", "argparse", "psutil"}


def single_host_job(base: Path) -> Path:
    (base / "code").mkdir(parents=True)
    (base / "code" / "job.py").write_text("pass\n")
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps({"sagemaker_program": json.dumps("job.py")}))
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "inputdataconfig.json").write_text("{}")
    for sub in ("model", "output/data"):
        (base / sub).mkdir(parents=True)
    return base


def test_a_single_host_train_imports_no_guard_and_no_channel(tmp_path):
    base = single_host_job(tmp_path / "ml")
    train = Path(sys.executable).with_name("train")
    env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", "HOME": str(tmp_path),
           "SAGEMAKER_BASE_DIR": str(base), "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run([str(train)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", proc.stderr, re.M))
    assert "training_toolkit.runners.single" in imported and "training_toolkit.agent" in imported
    assert imported & NOT_FOR_ONE_HOST == set()
