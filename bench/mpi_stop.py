"""A stopped MPI job: the time from the stop to every host's exit, after the slowest rank's save.

``training-toolkit local --hosts 2 --distribution mpi --processes-per-host 2``; every rank's SIGTERM handler
saves for SAVE_S (1 s) and exits.  Once all four ranks run, ``local`` gets SIGTERM (a platform's stop: it
passes it to every host's ``train``), and the figure is the time until ``local`` returns (every host's exit),
less the save.  Each run also says whether the lead's log held a block of Open MPI's runtime (its lines of
dashes, such as ORTE's "unable to reliably start one or more daemons") or "Forwarding signal".
Usage: .venv/bin/python bench/mpi_stop.py [ROUNDS]   (default 5)
"""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO

LOCAL = str(REPO / ".venv" / "bin" / "training-toolkit")
SAVE_S = 1.0
SCRIPT = f"""import os, signal, sys, time
def save(*_):
    time.sleep({SAVE_S})
    open(os.path.join(os.environ["SM_MODEL_DIR"], "saved-" + os.environ["OMPI_COMM_WORLD_RANK"]), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
open(os.path.join(os.environ["SM_MODEL_DIR"], "up-" + os.environ["OMPI_COMM_WORLD_RANK"]), "w").close()
time.sleep(300)
"""


def one_round() -> tuple[float, int, int, bool]:
    """Seconds from the stop to local's return, less the save; local's exit code; saves kept; a runtime block said."""
    with tempfile.TemporaryDirectory() as tmp:
        src, work = Path(tmp) / "src", Path(tmp) / "w"
        src.mkdir()
        (src / "job.py").write_text(SCRIPT)
        local = subprocess.Popen([LOCAL, "local", "--hosts", "2", "--distribution", "mpi", "--processes-per-host", "2",
                                  "--source", str(src), "--entry-point", "job.py", "--workdir", str(work),
                                  "--stop-grace", "20", "--timeout", "300"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while len(list(work.glob("*/opt/ml/model/up-*"))) < 4:
            if time.monotonic() > deadline or local.poll() is not None:
                local.kill()
                raise SystemExit(f"the ranks did not start (local: {local.poll()})")
            time.sleep(0.05)
        time.sleep(0.5)  # every handler set
        start = time.monotonic()
        local.send_signal(signal.SIGTERM)
        out, _ = local.communicate(timeout=120)
        took = time.monotonic() - start - SAVE_S
        saved = len(list(work.glob("*/opt/ml/model/saved-*")))
        said = bool(re.search(rb"-{40}|Forwarding signal", out))
        return took, local.returncode, saved, said


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    runs = []
    for _ in range(rounds):
        took, code, saved, said = one_round()
        runs.append(took)
        print(f"  {took:5.2f} s after the save; local exit {code}; {saved}/4 saves kept; runtime block said: {said}",
              flush=True)
    print(f"a stopped MPI job (2 hosts x 2 ranks, {SAVE_S:g} s saves): every host out {statistics.median(runs):.2f} s "
          f"after the save (median of {rounds}; {min(runs):.2f}-{max(runs):.2f})")


if __name__ == "__main__":
    main()
