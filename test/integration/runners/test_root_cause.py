"""The root cause is the earliest failure, not the first report to reach the first host (end to end).

algo-3's rank fails first, but its report is held back: a process it left
behind keeps its stderr open, so its host waits the bounded 0.5 s for the last
words before reporting.  algo-2's rank fails 0.25 s later and its report
arrives first.  Every host must name algo-3's failure.  The ordering rule
itself is tabled in test/unit/agent/test_decisions.py.
"""

from __future__ import annotations

import pytest

from helpers.multihost import hps, run
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root]
H3 = ("algo-1", "algo-2", "algo-3")

SCRIPT = """\
import argparse, os, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--sync")
args = parser.parse_args()
rank = int(os.environ["RANK"])
open(os.path.join(args.sync, f"up-{rank}"), "w").close()
end = time.time() + 30
while len([f for f in os.listdir(args.sync) if f.startswith("up-")]) < 3 and time.time() < end:
    time.sleep(0.01)
if rank == 2:
    subprocess.Popen(["sleep", "5"])  # keeps stderr open: this host's report waits for its last words
    sys.exit("rank 2 failed first")
if rank == 1:
    time.sleep(0.25)
    sys.exit("rank 1 failed second")
time.sleep(60)
"""


def test_the_earliest_failure_is_named_though_its_report_arrives_later(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "dp.py").write_text(SCRIPT)
    sync = tmp_path / "sync"
    sync.mkdir()
    job = LocalJob(hosts=H3, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"},
                   hyperparameters=hps("dp.py", src, sagemaker_torch_distributed_enabled=True,
                                       sagemaker_distributed_processes_per_host=1, sync=str(sync)))
    results = run(job, tmp_path, timeout_s=60)
    for r in results:
        assert r.exit_code == 1, (r.host, r.failure)
        assert r.failure.splitlines()[0] == "algo-3 rank 2: dp.py exited with code 1: rank 2 failed first", r.failure
    ended = [r.ended_at for r in results]
    assert max(ended) - min(ended) < 3
