"""An N-node x R-rank MPI job under a real Slurm (2 x 2 unless told): sbatch to the job's end, ours against
Slurm's own MPI launch.

One local Slurm cluster (training_toolkit.local.slurm: real slurmctld, slurmd per namespace host),
rounds interleaved, each round's rows in a seeded shuffled order (``shuffled``): the same mpi4py allreduce script

- ours: ``srun --ntasks-per-node=1 train`` with ``sagemaker_mpi_enabled`` and R processes per host:
  join, mpirun starting its daemons through Slurm (``srun --overlap`` inside the step), verdict on
  every node (the default under Slurm);
- ours-ssh: the same with ``TRAINING_TOOLKIT_MPI_LAUNCHER=ssh``: keys, an sshd per node, mpirun over
  the toolkit's ssh (what the toolkit did under Slurm before);
- srun: ``srun --mpi=pmix --ntasks-per-node=R python script`` (Slurm starts the ranks itself; pmi2
  does not work with Debian's Open MPI 4, which has no PMI2 support built in);
- and the two ways a ``train`` could launch, bare, from the first node of a one-task-per-node step as
  train's is (no train: the launch alone): step-mpirun, mpirun with Open MPI's Slurm launcher
  (``--mca plm slurm --mca plm_slurm_args --overlap``: ``srun ... orted``), and step-srun, the ranks
  started by ``srun --overlap --mpi=pmix`` themselves; and step-mpirun-no-ofi, step-mpirun without Open
  MPI 4's libfabric BTL (``--mca btl ^openib,ofi``), which alone costs about 1 s in each rank's
  ``MPI_Finalize`` here (docs/slurm.md).

Each figure is the wall time from sbatch's call to the job's completion record in slurmctld's job
completion log (queueing, the batch step and the job's end included), printed also in three parts from
the batch script's own clock lines (sbatch to the script's start, the script's step, the step's end to
the record; ``parts``), each job submitted once the
previous one's nodes are idle again (``idle``).  The nodes are ``node1`` .. ``nodeN``, namespace hosts
of one local cluster, 4 CPUs each in Slurm's eyes (so R is at most 4).  Needs root, Slurm, munge, Open MPI,
openssh-server, mpi4py.
Usage: .venv/bin/python bench/slurm_mpi.py [ROUNDS] [--nodes N] [--ranks-per-node R]   (default 5, 2, 2)
"""

from __future__ import annotations

import argparse
import json
import random
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


#: The batch script's clock lines in its output: ``MARK + "start"`` / ``"end"``, then the epoch seconds
MARK = "tt-bench-"


def parts(output: str, submitted: float, took: float) -> tuple[float, float, float]:
    """One job's figure cut in three: sbatch's call to the batch script's start (slurmctld's allocation: it
    follows the job before, not the row; docs/slurm.md), the script's step (the launch and the ranks: where the rows differ), and the step's end to the
    completion record.  ``submitted`` is the wall clock (epoch s) at sbatch's call, ``took`` the figure."""
    marks = {word[len(MARK):]: float(value) for word, value in
             (line.split()[:2] for line in output.splitlines() if line.startswith(MARK) and len(line.split()) >= 2)}
    if set(marks) != {"start", "end"}:
        raise SystemExit(f"batch output without both clock lines ({MARK}start/end): {output[-2000:]}")
    return marks["start"] - submitted, marks["end"] - marks["start"], submitted + took - marks["end"]


def batch(path: Path, nodes: int, tasks_per_node: int, body: str) -> Path:
    """Each allocation as its launch wants it: srun inherits the batch's task count (SLURM_NTASKS).

    The script writes the clock (``MARK``) at its start and at its step's end, for ``parts``.
    """
    path.write_text(f"#!/bin/sh\n#SBATCH --nodes={nodes} --ntasks-per-node={tasks_per_node} --cpus-per-task=1\n"
                    f"#SBATCH --output={path}.out\necho {MARK}start $(date +%s.%N)\n{body}\nstatus=$?\n"
                    f"echo {MARK}end $(date +%s.%N)\nexit $status\n")
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


def timed(slurm: SlurmCluster, script: Path) -> tuple[float, float, float, float]:
    """From sbatch's call until slurmctld writes the job's completion record (polled every 20 ms), and its
    three ``parts``: the figure first.

    ``sbatch --wait`` is no clock: it polls the job's state at growing intervals (about 10 s here).
    """
    idle(slurm)
    start, submitted = time.monotonic(), time.time()
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
                return (took, *parts(Path(f"{script}.out").read_text(), submitted, took))
        time.sleep(0.02)
    raise SystemExit(f"{script.name}: job {job} did not end within 300 s")


def in_step(path: Path, command: str) -> str:
    """The batch body: one task per node, as ``srun train`` is; the first node's task runs ``command``."""
    path.write_text(f"#!/bin/sh\nif [ \"$SLURM_NODEID\" = 0 ]; then\n{command}\nfi\n")
    path.chmod(0o755)
    return f"srun --ntasks-per-node=1 {path}"


def node_names(nodes: int) -> list[str]:
    """The local cluster's nodes, in Slurm's order: node1 .. nodeN."""
    return [f"node{i}" for i in range(1, nodes + 1)]


def clean(nodes: int, per_node: int) -> str:
    """What train gives mpirun and srun of Slurm's environment (runners/mpi.py: slurm_environment): the job, no task."""
    return ("env -i PATH=$PATH HOME=/root SLURM_JOB_ID=$SLURM_JOB_ID SLURM_JOBID=$SLURM_JOB_ID SLURM_CONF=$SLURM_CONF "
            f"SLURM_NODELIST={','.join(node_names(nodes))} 'SLURM_TASKS_PER_NODE={per_node}(x{nodes})'")


def jobs(work: Path, code: Path, nodes: int, per_node: int) -> dict[str, Path]:
    """Every row's batch script, written under ``work``, by row name in the order they run."""
    names = node_names(nodes)
    hps = {"sagemaker_program": "allreduce.py", "sagemaker_submit_directory": str(code),
           "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": per_node}
    ours = batch(work / "ours.sbatch", nodes, 1, f"export TRAINING_TOOLKIT_HYPERPARAMETERS='{json.dumps(hps)}'\n"
                 f"srun --ntasks-per-node=1 {TRAIN}")
    ssh = batch(work / "ours-ssh.sbatch", nodes, 1, f"export TRAINING_TOOLKIT_HYPERPARAMETERS='{json.dumps(hps)}'\n"
                f"export TRAINING_TOOLKIT_MPI_LAUNCHER=ssh TRAINING_TOOLKIT_SSH_PORT=2222\n"
                f"srun --ntasks-per-node=1 {TRAIN}")
    bare = batch(work / "srun.sbatch", nodes, per_node,
                 f"cd {code} && srun --mpi=pmix --ntasks-per-node={per_node} {PYTHON} allreduce.py")
    mpirun = batch(work / "step-mpirun.sbatch", nodes, 1, in_step(work / "step-mpirun.sh", (
        f"cd {code} && {clean(nodes, per_node)} mpirun --allow-run-as-root -np {nodes * per_node} "
        f"--host {','.join(f'{name}:{per_node}' for name in names)} --mca plm slurm "
        "--mca plm_slurm_args --overlap --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
        f"--bind-to none --map-by slot --mca pml ob1 --mca btl ^openib {PYTHON} allreduce.py")))
    no_ofi = batch(work / "step-mpirun-no-ofi.sbatch", nodes, 1, in_step(work / "step-mpirun-no-ofi.sh", (
        (work / "step-mpirun.sh").read_text().split("\n")[2].replace("--mca btl ^openib", "--mca btl ^openib,ofi"))))
    ranks = batch(work / "step-srun.sbatch", nodes, 1, in_step(work / "step-srun.sh", (
        f"cd {code} && {clean(nodes, per_node)} srun --overlap --overcommit --mpi=pmix --nodes={nodes} "
        f"--nodelist={','.join(names)} --ntasks={nodes * per_node} --ntasks-per-node={per_node} "
        f"--distribution=block --kill-on-bad-exit=1 {PYTHON} allreduce.py")))
    return {"ours": ours, "ours-ssh": ssh, "srun": bare, "step-mpirun": mpirun, "step-mpirun-no-ofi": no_ofi,
            "step-srun": ranks}


def shuffled(names: list[str], turn: int) -> list[str]:
    """Round ``turn``'s order, shuffled with the round as seed (the same every run): the time from sbatch to
    the batch script depends on the job before (docs/slurm.md, "The figure"), so no row may always follow
    the same one; turning a fixed order would keep nearly every row's predecessor."""
    order = list(names)
    random.Random(turn).shuffle(order)
    return order


def main(rounds: int, nodes: int, per_node: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="tt-bench-slurm-"))
    code = work / "code"
    code.mkdir()
    (code / "allreduce.py").write_text(SCRIPT)
    scripts = jobs(work, code, nodes, per_node)
    times: dict[str, list[float]] = {name: [] for name in scripts}
    split: dict[str, list[tuple[float, float, float]]] = {name: [] for name in scripts}
    with SlurmCluster(node_names(nodes), work / "slurm") as slurm:
        timed(slurm, scripts["srun"])  # warm-up: page cache, Slurm's first job
        for turn in range(rounds):
            for name in shuffled(list(scripts), turn):
                took, *cut = timed(slurm, scripts[name])
                times[name].append(took)
                split[name].append((cut[0], cut[1], cut[2]))
                print(f"{name} {took:.2f} = {' + '.join(f'{v:.2f}' for v in cut)}", file=sys.stderr,
                      flush=True)  # a cut-short run keeps its figures
    left = slurm.leftovers()
    if left:
        raise SystemExit(f"left behind: {left} (files in {work})")
    shutil.rmtree(work)
    for name, values in times.items():
        print(f"{name:18} sbatch to end, {nodes} nodes x {per_node} ranks: median {statistics.median(values):.2f} s "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs: "
              f"{', '.join(f'{v:.2f}' for v in values)})")
    for name, cuts in split.items():
        print(f"{name:18} medians: sbatch to script {statistics.median(c[0] for c in cuts):.2f} s, step "
              f"{statistics.median(c[1] for c in cuts):.2f} s, step's end to record {statistics.median(c[2] for c in cuts):.2f} s")
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"ours - srun: {median['ours'] - median['srun']:+.2f} s, ours-ssh - srun: "
          f"{median['ours-ssh'] - median['srun']:+.2f} s, step-mpirun - step-srun: "
          f"{median['step-mpirun'] - median['step-srun']:+.2f} s (medians)")


def arguments(argv: list[str]) -> argparse.Namespace:
    """ROUNDS, the node count and the ranks per node; each must be at least 1, ranks at most the nodes' 4 CPUs."""
    parser = argparse.ArgumentParser(prog="bench/slurm_mpi.py", description=__doc__.split("\n")[0])
    parser.add_argument("rounds", nargs="?", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--nodes", type=int, default=2, help="local namespace nodes (default 2)")
    parser.add_argument("--ranks-per-node", type=int, default=2, help="MPI ranks on each node, 1-4 (default 2)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.nodes < 1 or not 1 <= args.ranks_per_node <= 4:
        parser.error(f"need ROUNDS >= 1, --nodes >= 1 and 1 <= --ranks-per-node <= 4 (each node has 4 CPUs "
                     f"in Slurm's eyes); got {args.rounds}, {args.nodes}, {args.ranks_per_node}")
    return args


if __name__ == "__main__":
    ARGS = arguments(sys.argv[1:])
    main(ARGS.rounds, ARGS.nodes, ARGS.ranks_per_node)
