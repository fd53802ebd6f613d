"""A 2-node x 2-rank MPI job under a real Slurm: sbatch to the job's end, ours against Slurm's own MPI launch.

One local Slurm cluster (training_toolkit.local.slurm: real slurmctld, slurmd per namespace host),
rounds interleaved: the same mpi4py allreduce script

- ours: ``srun --ntasks-per-node=1 train`` with ``sagemaker_mpi_enabled`` and 2 processes per host:
  join, mpirun starting its daemons through Slurm (``srun --overlap`` inside the step), verdict on
  every node (the default under Slurm);
- ours-ssh: the same with ``TRAINING_TOOLKIT_MPI_LAUNCHER=ssh``: keys, an sshd per node, mpirun over
  the toolkit's ssh (what the toolkit did under Slurm before);
- srun: ``srun --mpi=pmix --ntasks-per-node=2 python script`` (Slurm starts the ranks itself; pmi2
  does not work with Debian's Open MPI 4, which has no PMI2 support built in);
- and the two ways a ``train`` could launch, bare, from the first node of a one-task-per-node step as
  train's is (no train: the launch alone): step-mpirun, mpirun with Open MPI's Slurm launcher
  (``--mca plm slurm --mca plm_slurm_args --overlap``: ``srun ... orted``), and step-srun, the ranks
  started by ``srun --overlap --mpi=pmix`` themselves; and step-mpirun-no-ofi, step-mpirun without Open
  MPI 4's libfabric BTL (``--mca btl ^openib,ofi``), which alone costs about 1 s in each rank's
  ``MPI_Finalize`` here (docs/slurm.md).

Each figure is the wall time from sbatch's call to the job's completion record in slurmctld's job
completion log (queueing, the batch step and the job's end included), each job submitted once the
previous one's nodes are idle again (``idle``).  Needs root, Slurm, munge, Open MPI, openssh-server, mpi4py.
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


def idle(slurm: SlurmCluster, timeout: float = 60) -> None:
    """Until no job is queued and every node is idle: a job's completion record comes before its nodes are
    free again (COMPLETING: the step daemons' ends, pmix's cleanup), and without this wait the next job
    would start late by whatever the previous one left, charged to the next job's figure (measured: 1-3 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = slurm.run(["squeue", "-h", "-o", "%i"], timeout=30).stdout.strip()
        states = slurm.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=30).stdout.split()
        if not queued and states and all(state == "idle" for state in states):
            return
        time.sleep(0.05)
    raise SystemExit(f"nodes not idle within {timeout:g} s")


def timed(slurm: SlurmCluster, script: Path) -> float:
    """From sbatch's call until slurmctld writes the job's completion record (polled every 20 ms).

    ``sbatch --wait`` is no clock: it polls the job's state at growing intervals (about 10 s here).
    """
    idle(slurm)
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


def in_step(path: Path, command: str) -> str:
    """The batch body: one task per node, as ``srun train`` is; the first node's task runs ``command``."""
    path.write_text(f"#!/bin/sh\nif [ \"$SLURM_NODEID\" = 0 ]; then\n{command}\nfi\n")
    path.chmod(0o755)
    return f"srun --ntasks-per-node=1 {path}"


#: What train gives mpirun and srun of Slurm's environment (runners/mpi.py: slurm_environment): the job, no task
CLEAN = ("env -i PATH=$PATH HOME=/root SLURM_JOB_ID=$SLURM_JOB_ID SLURM_JOBID=$SLURM_JOB_ID SLURM_CONF=$SLURM_CONF "
         "SLURM_NODELIST=node1,node2 'SLURM_TASKS_PER_NODE=2(x2)'")


def main(rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="tt-bench-slurm-"))
    code = work / "code"
    code.mkdir()
    (code / "allreduce.py").write_text(SCRIPT)
    hps = {"sagemaker_program": "allreduce.py", "sagemaker_submit_directory": str(code),
           "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
    ours = batch(work / "ours.sbatch", 1, f"export TRAINING_TOOLKIT_HYPERPARAMETERS='{json.dumps(hps)}'\n"
                 f"srun --ntasks-per-node=1 {TRAIN}")
    ssh = batch(work / "ours-ssh.sbatch", 1, f"export TRAINING_TOOLKIT_HYPERPARAMETERS='{json.dumps(hps)}'\n"
                f"export TRAINING_TOOLKIT_MPI_LAUNCHER=ssh TRAINING_TOOLKIT_SSH_PORT=2222\n"
                f"srun --ntasks-per-node=1 {TRAIN}")
    bare = batch(work / "srun.sbatch", 2, f"cd {code} && srun --mpi=pmix --ntasks-per-node=2 {PYTHON} allreduce.py")
    mpirun = batch(work / "step-mpirun.sbatch", 1, in_step(work / "step-mpirun.sh", (
        f"cd {code} && {CLEAN} mpirun --allow-run-as-root -np 4 --host node1:2,node2:2 --mca plm slurm "
        "--mca plm_slurm_args --overlap --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
        f"--bind-to none --map-by slot --mca pml ob1 --mca btl ^openib {PYTHON} allreduce.py")))
    no_ofi = batch(work / "step-mpirun-no-ofi.sbatch", 1, in_step(work / "step-mpirun-no-ofi.sh", (
        (work / "step-mpirun.sh").read_text().split("\n")[2].replace("--mca btl ^openib", "--mca btl ^openib,ofi"))))
    ranks = batch(work / "step-srun.sbatch", 1, in_step(work / "step-srun.sh", (
        f"cd {code} && {CLEAN} srun --overlap --overcommit --mpi=pmix --nodes=2 --nodelist=node1,node2 --ntasks=4 "
        f"--ntasks-per-node=2 --distribution=block --kill-on-bad-exit=1 {PYTHON} allreduce.py")))
    jobs = {"ours": ours, "ours-ssh": ssh, "srun": bare, "step-mpirun": mpirun, "step-mpirun-no-ofi": no_ofi,
            "step-srun": ranks}
    times: dict[str, list[float]] = {name: [] for name in jobs}
    with SlurmCluster(["node1", "node2"], work / "slurm") as slurm:
        timed(slurm, bare)  # warm-up: page cache, Slurm's first job
        for _ in range(rounds):
            for name, script in jobs.items():
                times[name].append(timed(slurm, script))
    left = slurm.leftovers()
    if left:
        raise SystemExit(f"left behind: {left} (files in {work})")
    shutil.rmtree(work)
    for name, values in times.items():
        print(f"{name:18} sbatch to end, 2 nodes x 2 ranks: median {statistics.median(values):.2f} s "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs: "
              f"{', '.join(f'{v:.2f}' for v in values)})")
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"ours - srun: {median['ours'] - median['srun']:+.2f} s, ours-ssh - srun: "
          f"{median['ours-ssh'] - median['srun']:+.2f} s, step-mpirun - step-srun: "
          f"{median['step-mpirun'] - median['step-srun']:+.2f} s (medians)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
