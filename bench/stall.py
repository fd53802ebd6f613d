"""Stall: the issue's 2-host x 2-rank mpi4py job, rank 3 asleep at step 3 while the others wait in allreduce.

TRAINING_TOOLKIT_STALL_TIMEOUT=10.  Per round: seconds from the last output line (rank 0's step) to each
host's exit (target: every host within 10 + 5 s), the exit codes (124), and whether the first line of
every host's failure file names rank 3 on algo-2 with its stack line.  The ranks run where ptrace is
denied (a seccomp filter, as a default container's) and py-spy is off: the faulthandler hook alone.

Needs root, Open MPI, openssh-server, mpi4py.   Usage: .venv/bin/python bench/stall.py [ROUNDS]  (default 3)
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from common import REPO
from resilience_common import Recorder, hps, source

from training_toolkit.local.launcher import LocalJob, default_train, run_local

NAMED = re.compile(r"stacks: rank 3 on algo-2: time\.sleep\(3600\) at mpi_stall\.py:\d+; ranks 0-2 on algo-1, algo-2: "
                   r"total = comm\.allreduce")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    after_last, ok = [], True
    noptrace = [sys.executable, str(REPO / "test" / "helpers" / "noptrace.py")]
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
            src = source(Path(tmp), "mpi_stall.py")
            job = LocalJob(hosts=("algo-1", "algo-2"), train=[*noptrace, *default_train()],
                           env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30", "TRAINING_TOOLKIT_STALL_TIMEOUT": "10",
                                "TRAINING_TOOLKIT_PY_SPY": "none", "STALL_RANK": "3"},
                           hyperparameters=hps("mpi_stall.py", src, sagemaker_mpi_enabled=True,
                                               sagemaker_mpi_num_of_processes_per_host=2))
            out = Recorder()
            results = run_local(job, Path(tmp) / "cluster", environ=os.environ, timeout_s=120, out=out)
            last = out.last(b"<stdout>:attempt ")  # rank 0's step lines, as mpirun tags them
            gaps = [r.ended_at - last for r in results]
            named = all(r.failure and NAMED.search(r.failure.splitlines()[0]) for r in results)
            codes = [r.exit_code for r in results]
            left = [s for r in results for s in r.survivors]
            ok = ok and named and codes == [124, 124] and max(gaps) < 15 and not left
            after_last += gaps
            print(f"round {i + 1}/{rounds}: exits {codes}, last output to exit "
                  f"{', '.join(f'{g:.2f}' for g in gaps)} s, stack named: {named}, left: {left or 'nothing'}", flush=True)
    print(f"stall (timeout 10 s) on 2 hosts x 2 ranks, {rounds} rounds: last output to a host's exit "
          f"median {statistics.median(after_last):.2f} s, max {max(after_last):.2f} s (target < 15); "
          f"{'every round as expected' if ok else 'NOT every round as expected'}")
    print("  (a loaded machine: shared with other test runs; figures are noisy)")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
