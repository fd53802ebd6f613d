"""A stop under a real Slurm is a stop for every rank: scancel and ``--time`` running out (docs/slurm.md).

Both end a job the same way: SIGTERM to every process of every step of the job (train's step and
the MPI daemons' step), SIGKILL after ``KillWait``.  Ranks whose handlers take different times
(rank 0 the slow one in one job, the last rank in another; the others 0 s and 0.5 s) must each
save, every node must end "stopped by SIGTERM" (143) soon after the slowest handler, long before
the grace (25 s) or KillWait (30 s), each rank's handler must run once (the same stop reaches a rank
from Slurm and from its node's train), and nothing may be left on any node.

Each test runs three jobs at once on one 6-node cluster: an MPI 2 x 2 with Open MPI 4 (mpi4py) on
node1-2, a torch_distributed 2 x 2 on node3-4 and an MPI 2 x 2 with Open MPI 5 (the wheel's PRRTE)
on node5-6; the second test of each kind swaps which rank is slow.  ``--time`` is in whole minutes
(``--time=0:05`` is a limit of 1 minute, seen with ``scontrol show job``) and slurmctld looks at
limits about every 30 s: a time-limit test lasts 60-90 s, so the jobs share one.
``scripts/repeat-tests.sh`` runs them many times in a row (docs/notes/slurm-runs.md has the counts).

Every test runs as root and as an ordinary user made for it, who submits and cancels its own jobs
(``helpers.slurm.as_root_and_user``).  Also here: ``pytorch_ddp`` (the SDK's older switch for torch.distributed) 2 x 2 under Slurm.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from helpers.multihost import hps, source_dir
from helpers.paths import FIXTURES, OMPI5_BIN, TOOLKIT_PYTHON
from helpers.slurm import as_root_and_user  # noqa: F401 - tmp_path: every test as root and as a user
from helpers.slurm import chown_tree, slurm_cluster, submit_argv
from integration.platforms.test_slurm import (FAST, batch_script, jobcomp, model_dir, rank_infos, settled, submit,
                                              verdict, wait_for)

pytestmark = [pytest.mark.slurm]

TRAIN = Path(sys.executable).with_name("train")
#: what the slow rank's handler takes: MPI's 3 s, torch's 10 s (as in test_stop_grace.py)
SLOWEST = {"mpi": 3, "ompi5": 3, "torch": 10}
NODES = {"mpi": ("node1", "node2"), "torch": ("node3", "node4"), "ompi5": ("node5", "node6")}
#: the jobs of a test, each (kind, which rank is slow)
SETS = {"mpi-first": (("mpi", "first-slow"), ("torch", "last-slow"), ("ompi5", "first-slow")),
        "mpi-last": (("mpi", "last-slow"), ("torch", "first-slow"), ("ompi5", "last-slow"))}
GRACE_S = 25  # the Slurm platform's default grace (docs/slurm.md), under KillWait 30 s


def delays_of(kind: str, order: str) -> list[float]:
    """Seconds each rank's handler takes, by rank: one slow, one 0.5 s, two that exit at once."""
    slow = SLOWEST[kind]
    return [slow, 0, 0.5, 0] if order == "first-slow" else [0, 0.5, 0, slow]


def job_env(src: Path, kind: str, delays: list[float]) -> dict[str, str]:
    if kind == "mpi":
        hp = hps("slow_save.py", src, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2)
        extra = {"USE_MPI4PY": "1"}  # a handler's sys.exit(143) is MPI_Abort under python -m mpi4py
    elif kind == "ompi5":
        # the ranks run the script as a program (mpi4py is built for Open MPI 4): a non-zero exit, PRRTE's abort
        hp = hps("slow_save", src, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2)
        extra = {"PATH": f"{OMPI5_BIN}:/usr/bin:/bin"}
    else:
        hp = hps("slow_save.py", src, sagemaker_torch_distributed_enabled=True,
                 sagemaker_distributed_processes_per_host=2)
        extra = {}
    return {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps({k: json.loads(v) for k, v in hp.items()}),
            "SAVE_DELAYS": ",".join(map(str, delays)), "WAIT_S": "200", **extra}


def submit_job(slurm, directory: Path, nodes: tuple[str, ...], env: dict[str, str], time_limit: str | None) -> str:
    """sbatch of ``srun train`` on exactly these nodes (the jobs share the cluster); the job's id."""
    directory.mkdir()
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    limit = f"#SBATCH --time={time_limit}\n" if time_limit else ""
    script = directory / "job.sbatch"
    script.write_text(f"#!/bin/sh\n#SBATCH --nodes={len(nodes)} --ntasks-per-node=1 --nodelist={','.join(nodes)}\n"
                      f"{limit}#SBATCH --output={directory}/slurm-%j.out\n{exports}"
                      f"srun --ntasks-per-node=1 {TRAIN}\n")
    if slurm.user is not None:  # as the cluster's user: its script, its job's output (helpers.slurm)
        chown_tree(directory, slurm.user)
    argv, env = submit_argv(slurm, ["sbatch", "--parsable", str(script)])
    result = slurm.run(argv, timeout=60, env=env, cwd=str(directory))
    job = result.stdout.split(";")[0].strip()
    assert job.isdigit(), (result.stdout, result.stderr)
    return job


def count(slurm, nodes, pattern: str) -> int:
    return sum(len(list(model_dir(slurm, h).glob(pattern))) for h in nodes)


def ended_at(slurm, host: str) -> float:
    """When this node's train wrote its verdict (the file's mtime, the machine's clock)."""
    output = slurm.cluster.host(host).opt_ml / "output"
    return max(p.stat().st_mtime for p in output.iterdir() if p.name in ("success", "failure"))


@pytest.mark.mpi
@pytest.mark.openmpi5
@pytest.mark.torch
@pytest.mark.parametrize("jobs", sorted(SETS))
@pytest.mark.parametrize("trigger", ["scancel", "time_limit"])
def test_a_slurm_stop_keeps_every_ranks_save(tmp_path, trigger, jobs):
    src = source_dir(tmp_path, "slow_save.py")
    (src / "slow_save").write_text(f"#!{TOOLKIT_PYTHON}\n" + (FIXTURES / "slow_save.py").read_text())
    (src / "slow_save").chmod(0o755)
    jobs = [(kind, order, NODES[kind]) for kind, order in SETS[jobs]]
    with slurm_cluster(tmp_path, nodes=6, kill_wait_s=30) as slurm:
        ids = {}
        for kind, order, nodes in jobs:
            ids[kind] = submit_job(slurm, tmp_path / kind, nodes, job_env(src, kind, delays_of(kind, order)),
                                   "0:05" if trigger == "time_limit" else None)
        for kind, _, nodes in jobs:
            # the limit (1 minute, checked every 30 s or so) must find every rank waiting with its handler set
            wait_for(lambda nodes=nodes: count(slurm, nodes, "waiting-*") == 4, 50, f"every {kind} rank waiting")
        sent = {}
        if trigger == "scancel":
            for kind in ids:
                sent[kind] = time.time()
                argv, env = submit_argv(slurm, ["scancel", ids[kind]])  # the job's own user cancels it
                assert slurm.run(argv, timeout=60, env=env).returncode == 0
        comps = {kind: jobcomp(slurm, job, 150) for kind, job in ids.items()}
        left = settled(slurm, timeout=60)
        results = {}
        for kind, order, nodes in jobs:
            delays = delays_of(kind, order)
            files = {int(p.name.split("-")[1]): p for h in nodes for p in model_dir(slurm, h).glob("saved-*")}
            saved = {rank: p.stat().st_mtime for rank, p in files.items()}
            # the same stop reaches a rank more than once (Slurm, srun's forward, its node's train): its handler runs once
            runs = {rank: len(p.read_text().splitlines()) for rank, p in files.items()}
            # no clock of Slurm's SIGTERM for --time: a rank with no delay saved as it came, within a moment
            start = sent.get(kind, min([saved[r] - delays[r] for r in saved], default=0))
            results[kind] = {"order": order, "delays": delays, "saved": saved, "runs": runs, "start": start,
                             "verdicts": {h: verdict(slurm, h) for h in nodes},
                             "ended": {h: ended_at(slurm, h) - start for h in nodes
                                       if verdict(slurm, h)[0] != "none"}}
        outs = {kind: (tmp_path / kind / f"slurm-{job}.out").read_text(errors="replace") for kind, job in ids.items()}
    assert left == {}, left
    for kind, r in results.items():
        check_stop(kind, r, comps[kind], outs[kind], trigger)


def check_stop(kind: str, r: dict, comp: dict, out: str, trigger: str) -> None:
    """One job's stop: every rank saved, the job's state, every node "stopped by SIGTERM", and the end with the
    slowest handler, not with the grace or KillWait."""
    assert sorted(r["saved"]) == [0, 1, 2, 3], (kind, r, out)
    assert set(r["runs"].values()) == {1}, (kind, "a handler ran more than once", r["runs"])
    assert comp["JobState"] == ("TIMEOUT" if trigger == "time_limit" else "CANCELLED"), (kind, comp)
    for host, (name, text) in r["verdicts"].items():
        assert name == "failure" and "stopped by SIGTERM" in text.splitlines()[0], (kind, host, name, text)
    took = max(r["ended"].values())
    print(f"\nstop: {trigger} {kind} {r['order']}: every node ended {took:.2f} s after the stop "
          f"(slowest handler {max(r['delays']):g} s); job {comp['StartTime']} to {comp['EndTime']}")
    assert max(r["delays"]) - 0.5 <= took < max(r["delays"]) + 12 < GRACE_S, \
        f"{kind}: each node's end after the stop {r['ended']}; verdicts {r['verdicts']}; output:\n{out}"
    if trigger == "time_limit":
        assert "DUE TO TIME LIMIT" in out, out


@pytest.mark.torch
def test_pytorch_ddp_2_nodes_x_2(tmp_path):
    """``sagemaker_pytorch_ddp_enabled`` runs as torch_distributed does: 4 gloo DDP processes, one set of weights."""
    src = source_dir(tmp_path, "torch_ddp_train.py")
    hp = hps("torch_ddp_train.py", src, sagemaker_pytorch_ddp_enabled=True, sagemaker_distributed_processes_per_host=2)
    env = {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps({k: json.loads(v) for k, v in hp.items()})}
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env))
        ranks = rank_infos(slurm)
        verdicts = [verdict(slurm, h)[0] for h in ("node1", "node2")]
        comp = jobcomp(slurm, job)
        assert settled(slurm) == {}
    assert code == 0 and verdicts == ["success", "success"], out
    assert comp["JobState"] == "COMPLETED", comp
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["world"] == 4 and info["local_rank"] == rank % 2 and info["host"] == f"node{rank // 2 + 1}"
               for rank, info in ranks.items())
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1
