"""A 2-node x 2-rank MPI job under a real Slurm: sbatch to the job's end, ours against Slurm's own MPI launch.

One local Slurm cluster (training_toolkit.local.slurm: real slurmctld, slurmd per namespace host),
rounds interleaved: the same mpi4py allreduce script

- ours: ``srun --ntasks-per-node=1 train`` with ``sagemaker_mpi_enabled`` and 2 processes per host
  (join, keys, sshd per node, mpirun over the toolkit's ssh, verdict on every node);
- srun: ``srun --mpi=pmix --ntasks-per-node=2 python script`` (Slurm starts the ranks itself; pmi2
  does not work with Debian's Open MPI 4, which has no PMI2 support built in).

Each figure is the wall time from sbatch's call to the job's completion record in slurmctld's job
completion log (queueing, the batch step and the job's end included).  Needs root, Slurm, munge, Open MPI, openssh-server, mpi4py.
Usage: .venv/bin/python bench/slurm_mpi.py [ROUNDS]      (default 5)
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON

from training_toolkit.local.slurm import SlurmCluster

TRAIN = PYTHON.with_name("train")
SCRIPT = """from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
assert total == comm.Get_size() * (comm.Get_size() + 1) // 2
print(comm.Get_rank(), comm.Get_size(), total, flush=True)
"""


def batch(path: Path, tasks_per_node: int, body: str) -> Path:
    """Each allocation as its launch wants it: srun inherits the batch's task count (SLURM_NTASKS)."""
    path.write_text(f"#!/bin/sh\n#SBATCH --nodes=2 --ntasks-per-node={tasks_per_node} --cpus-per-task=1\n"
                    f"#SBATCH --output={path}.out\n{body}\n")
    return path


def timed(slurm: SlurmCluster, script: Path) -> float:
    """From sbatch's call until slurmctld writes the job's completion record (polled every 20 ms).

    ``sbatch --wait`` is no clock: it polls the job's state at growing intervals (about 10 s here).
    """
    start = time.monotonic()
    result = slurm.run(["sbatch", "--parsable", str(script)], timeout=60)
    job = result.stdout.strip().split(";")[0]
    deadline = start + 300
    while time.monotonic() < deadline:
        for line in (slurm.jobcomp.read_text() if slurm.jobcomp.exists() else "").splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("JobId") == job:
                took = time.monotonic() - start
                if fields.get("JobState") != "COMPLETED":
                    raise SystemExit(f"{script.name}: job {job} {fields.get('JobState')}: "
                                     f"{Path(f'{script}.out').read_text()[-2000:]}")
                return took
        time.sleep(0.02)
    raise SystemExit(f"{script.name}: job {job} did not end within 300 s")


def main(rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="tt-bench-slurm-"))
    code = work / "code"
    code.mkdir()
    (code / "allreduce.py").write_text(SCRIPT)
    hps = {"sagemaker_program": "allreduce.py", "sagemaker_submit_directory": str(code),
           "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
    ours = batch(work / "ours.sbatch", 1, f"export TRAINING_TOOLKIT_HYPERPARAMETERS='{json.dumps(hps)}'\n"
                 f"srun --ntasks-per-node=1 {TRAIN}")
    bare = batch(work / "srun.sbatch", 2, f"cd {code} && srun --mpi=pmix --ntasks-per-node=2 {PYTHON} allreduce.py")
    times: dict[str, list[float]] = {"ours": [], "srun": []}
    with SlurmCluster(["node1", "node2"], work / "slurm") as slurm:
        timed(slurm, bare)  # warm-up: page cache, Slurm's first job
        for _ in range(rounds):
            times["ours"].append(timed(slurm, ours))
            times["srun"].append(timed(slurm, bare))
    left = slurm.leftovers()
    if left:
        raise SystemExit(f"left behind: {left} (files in {work})")
    shutil.rmtree(work)
    for name, values in times.items():
        print(f"{name:5} sbatch to end, 2 nodes x 2 ranks: median {statistics.median(values):.2f} s "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs: "
              f"{', '.join(f'{v:.2f}' for v in values)})")
    print(f"ours - srun: {statistics.median(times['ours']) - statistics.median(times['srun']):+.2f} s (medians)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
