"""The picture in docs/resilience.md: a real ``local`` job with a stall and a host lost, drawn from its records.

Four hosts (three seated, a spare), torch gloo, one rank per host, a checkpoint every step. Attempt 1:
rank 1 hangs at step 4; the stall watch (5 s) restarts the job. Attempt 2: algo-3 is killed whole at
its step 3 (``test/helpers/deadhost.py``); the spare takes its seat. Attempt 3 completes.
Usage: .venv/bin/python bench/timeline_example.py [OUTPUT]   (default docs/images/timeline-example.png)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path

from common import REPO

sys.path.insert(0, str(REPO / "test"))
from helpers.deadhost import HostKiller, wait_for  # noqa: E402

from training_toolkit.local.launcher import LocalJob, run_local  # noqa: E402
from training_toolkit.record import timeline  # noqa: E402

SCRIPT = '''
import os, pathlib, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, attempt = dist.get_rank(), int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
shared = pathlib.Path(os.environ["SHARED_DIR"])
checkpoint = shared / "checkpoint"
start = int(checkpoint.read_text()) if checkpoint.exists() else 0
for step in range(start, 14):
    if attempt == 0 and rank == 1 and step == 4:
        time.sleep(3600)  # a hang: no output, no progress
    dist.all_reduce(torch.ones(1))
    print(f"attempt {attempt} rank {rank} step {step}", flush=True)
    if rank == 0:
        checkpoint.write_text(str(step + 1))
        (shared / f"step-{attempt}").write_text(str(step - start + 1))
    time.sleep(0.5)
'''


def main() -> int:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "images" / "timeline-example.png"
    work = Path(tempfile.mkdtemp(prefix="timeline-example-"))
    src, shared = work / "src", work / "shared"
    src.mkdir()
    shared.mkdir()
    (src / "train.py").write_text(SCRIPT)
    hps = {"sagemaker_program": json.dumps("train.py"), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_torch_distributed_enabled": "true", "sagemaker_distributed_processes_per_host": "1"}
    env = {"SHARED_DIR": str(shared), "TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "3",
           "TRAINING_TOOLKIT_STALL_TIMEOUT": "5", "TRAINING_TOOLKIT_STALL_STARTUP": "60",
           "TRAINING_TOOLKIT_GRACE_PERIOD": "5", "TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"}
    job = LocalJob(hosts=("algo-1", "algo-2", "algo-3", "algo-4"), env=env, hyperparameters=hps)
    killer = HostKiller()
    errors: list[BaseException] = []

    def kill() -> None:
        try:
            wait_for(shared / "step-1", timeout_s=240, at_least=3)
            killer.kill("algo-3")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threading.Thread(target=kill, daemon=True).start()
    results = run_local(job, work / "cluster", environ=os.environ, timeout_s=420, out=sys.stdout.buffer,
                        before_start=killer.before_start)
    print({r.host: r.exit_code for r in results}, errors or "")
    picture = timeline.layout(timeline.find_records(work / "cluster"))
    timeline.draw(picture, output)
    print(picture.title)
    print(output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
