"""Output throughput: ~200 MB of log lines (print per line) through `train` vs the same script run directly.

The reader drains the pipe as fast as it can, as a log collector would.  Both stdout (inherited
by the script, untouched) and stderr (relayed by the supervisor, which keeps a tail) are measured.
Target: ratio <= 1.05.   Usage: .venv/bin/python bench/output_throughput.py [MEGABYTES] [ROUNDS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import OURS, PYTHON, env_for, make_tree

SCRIPT = """
import sys
megabytes = float(sys.argv[sys.argv.index("--megabytes") + 1])
out = sys.stdout if sys.argv[sys.argv.index("--stream") + 1] == "stdout" else sys.stderr
line = "step 000123 loss=0.123456 accuracy=0.987654 lr=0.001 throughput=1234.5 samples/s"
for step in range(int(megabytes * 1024 * 1024 // (len(line) + 1))):
    print(line, file=out)
"""


def drain(cmd, env, cwd, stream) -> float:
    t0 = time.perf_counter()
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL} if stream == "stdout" else \
         {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, **kw)
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    total = 0
    while chunk := pipe.read1(1 << 20):
        total += len(chunk)
    proc.wait()
    return time.perf_counter() - t0


def main() -> None:
    megabytes = float(sys.argv[1]) if len(sys.argv) > 1 else 200
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    with tempfile.TemporaryDirectory() as tmp:
        for stream in ("stdout", "stderr"):
            tree = make_tree(Path(tmp) / stream, SCRIPT, hps={"megabytes": str(megabytes), "stream": f'"{stream}"'})
            ours, bare = [], []
            for _ in range(rounds):
                ours.append(drain([str(OURS)], env_for(tree), None, stream))
                bare.append(drain([str(PYTHON), "job.py", "--megabytes", str(megabytes), "--stream", stream], env_for(tree),
                                  tree / "code", stream))
            o, b = statistics.median(ours), statistics.median(bare)
            print(f"{stream}: {megabytes:.0f} MB  bare {b:6.3f} s ({megabytes / b:6.0f} MB/s)  "
                  f"through train {o:6.3f} s ({megabytes / o:6.0f} MB/s)  ratio {o / b:5.3f} (target <= 1.05; "
                  f"includes train's own start, see launch_overhead.py)")


if __name__ == "__main__":
    main()
