"""Soak: rounds of a 3-host x 2-rank MPI job with TRAINING_TOOLKIT_MAX_RESTARTS=2, one random fault per round.

Faults (on a random rank, or a random host for the SIGTERM), in the first attempt only:
- kill (SIGKILL), raise (an exception), exit3 (exit code 3), hang (sleeps; the stall timeout, 4 s, catches it):
  the job must restart once, resume from its checkpoint and succeed on every host;
- sigterm (the platform stops one host's train): the job must stop, never restart: every host non-zero.
Each round must end within its bound (60 s; a stop within the grace period, 10 s here, + 20 s) with nothing of
it left running.  Prints one line per round, then the tally; exit code 1 if any round went wrong.

Needs root, Open MPI, openssh-server, mpi4py.
Usage: .venv/bin/python bench/soak.py [ROUNDS] [SEED]    (default 10 rounds; the issue asks for 30)
"""

from __future__ import annotations

import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from resilience_common import Recorder, hps, source

from training_toolkit.local.launcher import LocalJob, run_local
from training_toolkit.local.netns import leftovers

HOSTS = ("algo-1", "algo-2", "algo-3")
FAULTS = ("kill", "raise", "exit3", "hang", "sigterm")
BOUND_S = 60.0


def one_round(tmp: Path, fault: str, rank: int, host: str) -> tuple[bool, str, float]:
    src = source(tmp, "mpi_stall.py")
    env = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
           "TRAINING_TOOLKIT_STALL_TIMEOUT": "4", "TRAINING_TOOLKIT_STALL_STARTUP": "60",
           "TRAINING_TOOLKIT_GRACE_PERIOD": "10", "STEPS": "8", "STEP_S": "0.3"}
    if fault != "sigterm":
        env.update({"FAULT": fault, "FAULT_RANK": str(rank), "FAULT_STEP": "2"})
    else:
        env["STEPS"] = "40"  # 12 s of steps: the signal (4-6 s after the start) always lands while the ranks run
    job = LocalJob(hosts=HOSTS, env=env, hyperparameters=hps("mpi_stall.py", src, sagemaker_mpi_enabled=True,
                                                               sagemaker_mpi_num_of_processes_per_host=2))
    tags: list[str] = []

    def on_start(procs):
        if fault == "sigterm":
            def later():
                time.sleep(random.uniform(4.0, 6.0))  # while the ranks run (they take about 3 s to start here)
                procs[host].send_signal(signal.SIGTERM)
            threading.Thread(target=later, daemon=True).start()

    out = Recorder()
    t0 = time.monotonic()
    results = run_local(job, tmp / "cluster", environ=os.environ, timeout_s=BOUND_S + 30, out=out, on_start=on_start,
                        before_start=lambda cluster: tags.append(cluster.tag))
    took = max((r.ended_at or time.monotonic()) for r in results) - t0
    codes = [r.exit_code for r in results]
    left = [s for r in results for s in r.survivors] + [x for tag in tags for x in leftovers(tag)]
    restarted = b"attempt 2 of 3 starting" in b"\n".join(line for _, line in out.lines)
    if fault == "sigterm":
        ok = all(c not in (0, None) for c in codes) and not restarted and took < 10 + 20
        verdict = f"stopped {codes}, restarted: {restarted}"
    else:
        ok = codes == [0, 0, 0] and restarted and took < BOUND_S
        verdict = f"exit codes {codes}, restarted: {restarted}"
    if left:
        ok = False
    if not ok:
        start = out.lines[0][0] if out.lines else 0.0
        sys.stdout.buffer.write(b"\n".join(b"%7.2f %s" % (t - start, line[:400]) for t, line in out.lines) + b"\n")
    return ok, f"{verdict}, {took:.1f} s, left: {left or 'nothing'}", took


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 13
    rng = random.Random(seed)
    tally = {fault: [0, 0] for fault in FAULTS}
    stopped: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):  # between rounds: stop after this one (run_local stops a round)
        signal.signal(sig, lambda signum, _frame: stopped.append(signum))
    for i in range(rounds):
        if stopped:
            print(f"stopped by signal {stopped[0]} after {i} rounds")
            rounds = i
            break
        fault = FAULTS[i % len(FAULTS)] if i < len(FAULTS) else rng.choice(FAULTS)  # every fault at least once
        if len(sys.argv) > 3:
            fault = sys.argv[3]  # one fault only, e.g. to look into it
        rank, host = rng.randrange(6), rng.choice(HOSTS)
        with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
            ok, what, _ = one_round(Path(tmp), fault, rank, host)
        tally[fault][0 if ok else 1] += 1
        target = f"host {host}" if fault == "sigterm" else f"rank {rank}"
        print(f"round {i + 1}/{rounds}: {fault:7} on {target}: {'ok ' if ok else 'BAD'} {what}", flush=True)
    bad = sum(b for _, b in tally.values())
    print(f"soak, 3 hosts x 2 ranks, K=2, {rounds} rounds (seed {seed}): "
          + ", ".join(f"{f} {g}/{g + b}" for f, (g, b) in tally.items()) + f"; {'all as expected' if not bad else f'{bad} BAD'}")
    print("  (a loaded machine: shared with other test runs; times are noisy)")
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
