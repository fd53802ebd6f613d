"""Launch overhead: `train` on a no-op script vs the reference's `train` vs `python noop.py`.

Runs are interleaved (ours, reference, bare, ours, ...) so a slow moment hits all three alike.
Targets: ours <= 0.35 x the reference, and within 60 ms of the bare command.
Usage: .venv/bin/python bench/launch_overhead.py [ROUNDS]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from common import OURS, PYTHON, REFERENCE, env_for, have_reference, make_tree, median_ms, timed


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory() as tmp:
        ours_tree = make_tree(Path(tmp) / "ours", "pass\n")
        ref_tree = make_tree(Path(tmp) / "ref", "pass\n")
        with_ref = have_reference()
        samples: dict[str, list[float]] = {"ours": [], "reference": [], "bare": []}
        for _ in range(rounds):
            samples["ours"].append(timed([str(OURS)], env_for(ours_tree)))
            if with_ref:
                samples["reference"].append(timed([str(REFERENCE)], env_for(ref_tree)))
            samples["bare"].append(timed([str(PYTHON), "job.py"], env_for(ours_tree), cwd=ours_tree / "code"))
    ours, bare = median_ms(samples["ours"]), median_ms(samples["bare"])
    print(f"launch overhead, median of {rounds} interleaved runs:")
    print(f"  bare python noop.py       {bare:7.1f} ms")
    print(f"  ours: train               {ours:7.1f} ms   (+{ours - bare:.1f} ms over bare; target <= 60)")
    if samples["reference"]:
        ref = median_ms(samples["reference"])
        print(f"  reference: train          {ref:7.1f} ms")
        print(f"  ratio ours/reference      {ours / ref:7.2f}      (target <= 0.35)")


if __name__ == "__main__":
    main()
