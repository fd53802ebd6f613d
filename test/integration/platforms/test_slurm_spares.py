"""A Slurm node lost mid-job under ``sbatch --no-kill``: a spare takes its seat, or the job shrinks (issue 25).

A real local Slurm cluster (``helpers.slurm``): the job is one ``srun --ntasks-per-node=1 train`` on every node of
the allocation, torch_distributed (gloo, CPU) with one checkpoint in a directory every node sees.  One worker node
is killed whole, as a node dies (``helpers/deadhost.py``): every process in its namespaces at once with SIGKILL,
its ``slurmd`` and ``munged`` included, so Slurm itself finds the node silent and marks it DOWN after
``SlurmdTimeout`` (10 s here instead of the default 60 s, to keep the test short).  ``--no-kill`` keeps the rest of
the allocation, and with it the step: ``train`` on the other nodes restarts the job inside the same step.
The batch host's own loss needs the controller elsewhere: that test puts slurmctld on a head host, no node.
Every test runs as root and as an ordinary user (``helpers.slurm.as_root_and_user``).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from helpers.deadhost import HostKiller, kill_when
from helpers.multihost import source_dir
from helpers.slurm import slurm_cluster
from helpers.slurm import as_root_and_user  # noqa: F401 - tmp_path: every test as root and as a user
from integration.platforms.test_slurm import batch_script, job_env, jobcomp, settled, submit, verdict

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.torch]

SLURMD_TIMEOUT_S = 10
# steps enough that training still runs when Slurm marks the lost node DOWN (SlurmdTimeout after the kill at step 3):
# that is when a step without its own --no-kill is ended (seen: every task Killed, "srun: Force Terminated")
ROOM = {"STEPS": "80", "STEP_S": "0.3"}


#: The runners whose spares are tried under Slurm: the fixture script and its distribution (ranks per node).
RUNNERS = {
    "torch": ("torch_spares.py", {"sagemaker_torch_distributed_enabled": True,
                                  "sagemaker_distributed_processes_per_host": 1}, 1),
    "mpi": ("mpi_spares.py", {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}, 2),
}


def torch_script(tmp_path: Path, nodes: int, env: dict, no_kill: bool = True, runner: str = "torch"
                 ) -> tuple[Path, Path]:
    program, distribution, _ = RUNNERS[runner]
    src = source_dir(tmp_path, program)
    shared = tmp_path / "shared"  # every node sees it, as a cluster's shared file system
    shared.mkdir()
    script = batch_script(tmp_path, nodes, {
        **job_env(src, program, **distribution),
        "SHARED_DIR": str(shared), "TRAINING_TOOLKIT_GRACE_PERIOD": "10", **env})
    if no_kill:  # the job's and the step's: with sbatch's alone, the step is ended when the node is marked DOWN
        text = script.read_text().replace("#SBATCH --nodes", "#SBATCH --no-kill --nodes")
        script.write_text(text.replace("srun --ntasks-per-node=1", "srun --no-kill --ntasks-per-node=1"))
    return script, shared


def kill_at(slurm, shared: Path, step: int, node: str) -> threading.Thread:
    """Kill ``node`` whole once attempt 0's rank 0 has done ``step`` steps, and with it its files in /tmp
    (``dead_nodes_files``): in a thread; join it after the job."""
    killer = HostKiller()
    killer.attach(slurm.cluster)
    thread = kill_when(killer, shared / "step-0-0", step, node, then=lambda dead: dead_nodes_files(slurm, dead))
    thread.killer = killer  # type: ignore[attr-defined]
    return thread


def seen(shared: Path, attempt: int) -> dict[int, dict]:
    return {info["rank"]: info for f in shared.glob(f"seen-{attempt}-*.json") if (info := json.loads(f.read_text()))}


def dead_nodes_files(slurm, node: str) -> None:
    """Remove what the dead node left in /tmp (its MPI ranks' directory and its progress watch's, each named after
    it): a real node's /tmp is its own and dies with it, the namespace nodes share the machine's, and the user's
    leftover check covers /tmp.  Root's runtime files are under each node's own /run, gone with the node's
    namespaces."""
    if slurm.user is not None:
        for path in [*Path("/tmp").glob(f"training-toolkit-*-{node}"), *Path("/tmp").glob(f"training-toolkit-watch-*-{node}-*")]:
            if path.lstat().st_uid == slurm.user.pw_uid:
                shutil.rmtree(path)


def placed(info: dict[int, dict]) -> list[tuple[int, str]]:
    return sorted((rank, i["host"]) for rank, i in info.items())


def placement(hosts: tuple[str, ...], per: int) -> list[tuple[int, str]]:
    """Ranks in host order, ``per`` ranks on each host."""
    return [(index * per + local, host) for index, host in enumerate(hosts) for local in range(per)]


def accounting(slurm, job: str, timeout: float = 60) -> list[list[str]]:
    """sacct's records of the job (JobID, State, ExitCode, NodeList), once none still runs: slurmdbd's come one by one."""
    deadline = time.monotonic() + timeout
    while True:
        acct = slurm.run(["sacct", "-j", job, "-n", "-P", "-o", "JobID,State,ExitCode,NodeList"], timeout=60)
        assert acct.returncode == 0, acct.stderr
        rows = [line.split("|") for line in acct.stdout.split()]
        ended = [r for r in rows if r[0] == job and r[1] not in ("PENDING", "RUNNING", "COMPLETING", "RESIZING")]
        if ended or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def node_state(slurm, node: str) -> str:
    return slurm.run(["sinfo", "-h", "-n", node, "-o", "%T"], timeout=30).stdout.strip()


@pytest.mark.parametrize("runner", ["torch", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_a_spare_node_takes_the_seat_of_a_node_lost_under_no_kill(tmp_path, runner):
    """4 nodes, MAX_HOSTS=3: node2 dies at step 3, node4 takes its seat (its ranks), every rank resumes from the
    one checkpoint, the job completes on node1, node3, node4 and Slurm accounts it COMPLETED without node2.

    MPI: mpirun's daemons run through Slurm (a step of their own); attempt 2's mpirun starts them on the attempt's
    nodes only (SLURM_NODELIST from the attempt's hosts, in Slurm's order), in a new step, while node2 is not yet
    DOWN, and its ranks follow the seating by name (--map-by seq), not Slurm's node order."""
    script, shared = torch_script(tmp_path, 4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3",
                                                "TRAINING_TOOLKIT_MAX_RESTARTS": "2", **ROOM}, runner=runner)
    per = RUNNERS[runner][2]
    with slurm_cluster(tmp_path, nodes=4, accounting=True, slurmd_timeout_s=SLURMD_TIMEOUT_S) as slurm:
        killing = kill_at(slurm, shared, 3, "node2")
        code, job, out = submit(slurm, script, timeout=300)
        killing.join(5)
        assert not killing.errors, killing.errors
        assert "node2" in killing.killer.killed, out
        comp = jobcomp(slurm, job)
        acct = accounting(slurm, job)
        down = node_state(slurm, "node2")
        verdicts = {h: verdict(slurm, h)[0] for h in slurm.names}
        assert settled(slurm) == {}
    assert code == 0, out
    assert verdicts == {"node1": "success", "node2": "none", "node3": "success", "node4": "success"}, out
    first = seen(shared, 0)
    assert placed(first) == placement(("node1", "node2", "node3"), per), first
    second = seen(shared, 1)  # the spare in node2's seat: the others keep their ranks, the world its size
    assert all(i["world"] == i["env_world"] == 3 * per and i["hosts"] == ["node1", "node4", "node3"]
               for i in second.values()), second
    # each rank on the host its seat names, the spare's ranks on node4, node3's kept: under MPI through Slurm the
    # daemons' step is in Slurm's node order, and the ranks follow the seating only by --map-by seq (docs/slurm.md)
    assert placed(second) == placement(("node1", "node4", "node3"), per), second
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second  # every rank resumed from the one checkpoint
    assert sorted(p.name for p in shared.glob("done-1-*")) == sorted(f"done-1-{r}" for r in range(3 * per))
    assert not list(shared.glob("seen-2-*")), "one restart was enough"
    assert "node1: attempt 2 of 3: node1, node4, node3 (node2 lost: connection closed; node4 takes its place)" in out
    # Slurm's own view: the node failed, the allocation was kept without it (the job resized), and the job completed
    assert "srun: error: Node failure on node2" in out, out
    assert down.startswith("down"), down
    assert comp["JobState"] == "COMPLETED" and comp["ExitCode"] == "0:0" and comp["NodeList"] == "node[1,3-4]", comp
    assert [job, "COMPLETED", "0:0", "node[1,3-4]"] in acct, acct


def test_without_a_spare_the_job_shrinks_to_the_minimum_and_completes(tmp_path):
    """3 nodes, MIN_HOSTS=2: node2 dies, the job goes on with node1 and node3 (world 2, node3 renumbered rank 1)."""
    script, shared = torch_script(tmp_path, 3, {"TRAINING_TOOLKIT_MIN_HOSTS": "2",
                                                "TRAINING_TOOLKIT_MAX_RESTARTS": "2", **ROOM})
    with slurm_cluster(tmp_path, nodes=3, accounting=True, slurmd_timeout_s=SLURMD_TIMEOUT_S) as slurm:
        killing = kill_at(slurm, shared, 3, "node2")
        code, job, out = submit(slurm, script, timeout=300)
        killing.join(5)
        assert not killing.errors, killing.errors
        comp = jobcomp(slurm, job)
        acct = accounting(slurm, job)
        verdicts = {h: verdict(slurm, h)[0] for h in slurm.names}
        assert settled(slurm) == {}
    assert code == 0, out
    assert verdicts == {"node1": "success", "node2": "none", "node3": "success"}, out
    second = seen(shared, 1)
    assert sorted((i["rank"], i["host"]) for i in second.values()) == [(0, "node1"), (1, "node3")]
    assert all(i["world"] == i["env_world"] == 2 and i["hosts"] == ["node1", "node3"] for i in second.values())
    assert sorted(i["shard"] for i in second.values()) == [list(range(0, 12, 2)), list(range(1, 12, 2))]
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second
    assert sorted(p.name for p in shared.glob("done-1-*")) == ["done-1-0", "done-1-1"]
    assert comp["JobState"] == "COMPLETED" and comp["NodeList"] == "node[1,3]", comp
    assert [job, "COMPLETED", "0:0", "node[1,3]"] in acct, acct


def test_without_no_kill_slurm_ends_the_job_when_it_finds_the_node_down(tmp_path):
    """The same spare job without --no-kill: train seats the spare at once, but once Slurm marks node2 DOWN it ends
    the whole job (NODE_FAIL), so the job never completes: --no-kill is what keeps it."""
    script, shared = torch_script(tmp_path, 4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                                "STEPS": "600", "STEP_S": "0.3"}, no_kill=False)
    with slurm_cluster(tmp_path, nodes=4, slurmd_timeout_s=SLURMD_TIMEOUT_S) as slurm:
        killing = kill_at(slurm, shared, 3, "node2")
        code, job, out = submit(slurm, script, timeout=300)
        killing.join(5)
        assert not killing.errors, killing.errors
        comp = jobcomp(slurm, job)
        assert settled(slurm, timeout=60) == {}
    assert seen(shared, 1), f"the spare was never seated: {out}"
    assert comp["JobState"] == "NODE_FAIL", comp
    assert not list(shared.glob("done-*")), "the job completed: Slurm did not end it"


@pytest.mark.parametrize("runner", ["torch", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_the_batch_hosts_loss_under_no_kill_the_work_completes_and_slurm_holds_the_allocation(tmp_path, runner):
    """4 nodes, MAX_HOSTS=3, slurmctld on a head host outside the allocation (as a real cluster's head node): node1,
    the batch host and the job's first lead, dies at step 3.  The toolkit fails over (node2 leads, node4 takes node1's
    seat) and the work completes with success on node2-4.  Slurm takes node1 out of the job once it is DOWN, but the
    job stays RUNNING with node1 its batch host: the batch script's end is never reported, so the allocation is held
    until its time limit or a scancel (docs/slurm.md, "The batch host's loss")."""
    script, shared = torch_script(tmp_path, 4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3",
                                                "TRAINING_TOOLKIT_MAX_RESTARTS": "2", **ROOM}, runner=runner)
    per = RUNNERS[runner][2]
    survivors = ("node2", "node3", "node4")
    with slurm_cluster(tmp_path, nodes=4, head=True, slurmd_timeout_s=SLURMD_TIMEOUT_S) as slurm:
        killing = kill_at(slurm, shared, 3, "node1")
        _, job, _ = submit(slurm, script, wait=False)
        killing.join(120)
        assert not killing.errors, killing.errors
        assert "node1" in killing.killer.killed
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (all(verdict(slurm, h)[0] != "none" for h in survivors)
                                                   and node_state(slurm, "node1").startswith("down")):
            time.sleep(0.5)
        verdicts = {h: verdict(slurm, h)[0] for h in slurm.names}
        time.sleep(15)  # well past the survivors' end and node1's DOWN: Slurm still holds the job
        show = slurm.run(["scontrol", "show", "job", job], timeout=30).stdout
        held = dict(w.split("=", 1) for w in show.split() if w.split("=", 1)[0] in ("JobState", "NodeList", "BatchHost"))
        assert slurm.run(["scancel", job], timeout=30).returncode == 0
        comp = jobcomp(slurm, job, timeout=60)
        assert settled(slurm, timeout=60) == {}
    assert verdicts == {"node1": "none", "node2": "success", "node3": "success", "node4": "success"}
    assert sorted(p.name for p in shared.glob("done-1-*")) == sorted(f"done-1-{r}" for r in range(3 * per))
    second = seen(shared, 1)  # under node2, rank 0 there; node4 in the lost lead's seat, node3's ranks kept
    assert placed(second) == placement(("node2", "node4", "node3"), per), second
    assert all(i["hosts"] == ["node2", "node4", "node3"] and i["world"] == 3 * per for i in second.values()), second
    assert held == {"JobState": "RUNNING", "NodeList": "node[2-4]", "BatchHost": "node1"}, show
    assert comp["JobState"] == "CANCELLED", comp
