"""MPI jobs on a 4-host local cluster: our runner vs a bare mpirun on hosts prepared in advance.

Three figures, from runs interleaved round by round (ours, bare, then the same with a killed rank):

1. job wall time of the same mpi4py allreduce (1 process per host): ``run_local`` with
   ``sagemaker_mpi_enabled``, from the call to the last host's exit (cluster bring-up, code,
   join, ssh dirs, sshd, mpirun and teardown of every host included), vs ``mpirun`` run inside
   algo-1 of a cluster that already has its ssh dirs written and sshd running on algo-2..4,
   with the same mpirun options our runner passes.  Target: ours <= bare + 1.0 s.
2. spread of the hosts' exits under our runner (first host's exit to last), from
   ``HostResult.ended_at``.  Target: <= 1 s (the reference sleeps 30-60 s).
3. a rank's death to the last host's exit: rank 3 (on algo-4) writes ``time.monotonic()`` to
   its ``SM_MODEL_DIR`` and SIGKILLs itself while the others wait in a barrier.  CLOCK_MONOTONIC
   is system-wide, so it compares with ``ended_at``.  Target: <= 3 s.

Lines marked (info) have no target: ours from the moment the hosts are up (before_start), and
(3) under the bare mpirun, as is and with ``--mca odls_base_sigkill_timeout 0``.

Needs root, Open MPI, openssh-server and mpi4py in the toolkit's venv.
Usage: .venv/bin/python bench/mpi_job.py [ROUNDS]      (default 5)
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON, WAIT_FOR_SSH, WRITE_SSH_DIR, LocalRun

from training_toolkit.local.launcher import INTERFACE, LocalJob
from training_toolkit.local.netns import NamespaceCluster, leftovers

HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")

ALLREDUCE = """\
from mpi4py import MPI
comm = MPI.COMM_WORLD
assert comm.allreduce(comm.Get_rank() + 1) == comm.Get_size() * (comm.Get_size() + 1) // 2
"""

KILL = """\
import os, signal, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.allreduce(1)  # every rank is up
if comm.Get_rank() == 3:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "killed_at"), "w") as f:
        f.write(repr(time.monotonic()))
    os.kill(os.getpid(), signal.SIGKILL)
comm.Barrier()  # the others wait for a rank that never comes
"""

# Open MPI 4 waits odls_base_sigkill_timeout (default 1 s) between SIGTERM and SIGKILL when it
# tears down the surviving ranks: (3) is measured once more under the bare mpirun with it at 0.
FAST_KILL = ("--mca", "odls_base_sigkill_timeout", "0")

# The job's ssh files at the same path on every prepared host (/run is a per-host tmpfs).
SSH_DIR = "/run/bench-mpi-ssh"
def base_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root")}


def job(src: Path, entry: str) -> LocalJob:
    hps = {"sagemaker_program": json.dumps(entry), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "1"}
    return LocalJob(hosts=HOSTS, hyperparameters=hps)


def ours(src: Path, entry: str, workdir: Path, expect_success: bool, tags: list[str]):
    """(seconds from the call to the last exit, seconds from the hosts being up to it, results) of one job."""
    run = LocalRun(job(src, entry), workdir, tags, timeout_s=120)
    run.check(entry, expect_success)
    return run.last_exit - run.started, run.last_exit - run.hosts_up, run.results


def prepare(cluster: NamespaceCluster, src: Path) -> list[str]:
    """Code, ssh dir and sshd in place on every host; the bare mpirun command to run in the first host."""
    hosts = [host.name for host in cluster.hosts]
    from training_toolkit.cluster.ssh.keys import generate_keypair

    client, host_key = generate_keypair("bench-client"), generate_keypair("bench-host")
    keys_file = Path(tempfile.mkdtemp(prefix="bench-mpi-keys-")) / "keys.json"
    keys_file.write_text(json.dumps({"client": [client.private.decode(), client.public],
                                     "host": [host_key.private.decode(), host_key.public]}))
    addresses = [host.address for host in cluster.hosts]
    for index, host in enumerate(cluster.hosts):
        (host.opt_ml / "code").mkdir(parents=True, exist_ok=True)
        (host.opt_ml / "model").mkdir(parents=True, exist_ok=True)
        for script in sorted(p.name for p in src.glob("*.py")):
            (host.opt_ml / "code" / script).write_text((src / script).read_text())
        side = ["client", *hosts[1:]] if index == 0 else ["server", *addresses]
        cluster.run(host, [str(PYTHON), "-c", WRITE_SSH_DIR, str(keys_file), SSH_DIR, *side], env=base_env(),
                    timeout=30, check=True)
    keys_file.unlink()
    keys_file.parent.rmdir()
    for host in cluster.hosts[1:]:
        cluster.popen(host, ["/usr/sbin/sshd", "-D", "-e", "-f", f"{SSH_DIR}/sshd_config"],
                      env={"PATH": base_env()["PATH"]}, stdin=subprocess.DEVNULL,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cluster.run(hosts[0], [str(PYTHON), "-c", WAIT_FOR_SSH, SSH_DIR, *hosts[1:]], env=base_env(), timeout=120,
                check=True)
    # The options our runner passes (runners/mpi_command.py, Open MPI 4), without its -x list and
    # the per-rank wrapper: the difference is what the toolkit costs, not a choice of flags.
    return ["mpirun", "--allow-run-as-root", "--host", ",".join(f"{h}:1" for h in hosts), "-np", str(len(hosts)),
            "--tag-output",
            "--mca", "btl_tcp_if_include", INTERFACE, "--mca", "oob_tcp_if_include", INTERFACE,
            "--mca", "plm_rsh_agent", f"ssh -F {SSH_DIR}/ssh_config", "--mca", "plm_rsh_no_tree_spawn", "1",
            "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "^openib",
            "--mca", "orte_abort_on_non_zero_status", "1", "-x", "SM_MODEL_DIR",
            str(PYTHON)]


def bare(cluster: NamespaceCluster, mpirun: list[str], script: str, expect_success: bool = True) -> float:
    """Seconds from the call to mpirun's exit (inside the first host)."""
    t0 = time.monotonic()
    proc = cluster.run(cluster.hosts[0], [*mpirun, script], env={**base_env(), "SM_MODEL_DIR": "/opt/ml/model"},
                       cwd="/opt/ml/code", timeout=300, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    elapsed = time.monotonic() - t0
    if (proc.returncode == 0) != expect_success:
        sys.stdout.buffer.write(proc.stdout)
        raise SystemExit(f"bare mpirun exited with {proc.returncode}: {shlex.join([*mpirun, script])}")
    return elapsed


def bare_death(cluster: NamespaceCluster, mpirun: list[str]) -> float:
    """Seconds from rank 3's SIGKILL to mpirun's exit, for the kill script under a bare mpirun."""
    stamp = cluster.hosts[3].opt_ml / "model" / "killed_at"
    stamp.unlink(missing_ok=True)
    bare(cluster, mpirun, "kill.py", expect_success=False)
    mpirun_end = time.monotonic()
    return mpirun_end - float(stamp.read_text())


def stats(samples: list[float]) -> str:
    return f"median {statistics.median(samples):6.2f} s  (min {min(samples):.2f}, max {max(samples):.2f})"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    tags: list[str] = []  # of every cluster run_local brought up, to check that none is left
    wall_ours, wall_ours_up, wall_bare, spread, death, death_bare, death_bare_fast = [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-mpi-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "allreduce.py").write_text(ALLREDUCE)
        (src / "kill.py").write_text(KILL)
        prepared = NamespaceCluster(HOSTS, Path(tmp) / "prepared")
        try:
            prepared.start()
            mpirun = prepare(prepared, src)
            for i in range(rounds):
                wall, from_up, results = ours(src, "allreduce.py", Path(tmp) / f"ours-{i}", True, tags)
                wall_ours.append(wall)
                wall_ours_up.append(from_up)
                ended = [r.ended_at for r in results]
                spread.append(max(ended) - min(ended))
                wall_bare.append(bare(prepared, mpirun, "allreduce.py"))
                _, _, results = ours(src, "kill.py", Path(tmp) / f"kill-{i}", False, tags)
                killed_at = float((results[3].model_dir / "killed_at").read_text())
                death.append(max(r.ended_at for r in results) - killed_at)
                death_bare.append(bare_death(prepared, mpirun))
                death_bare_fast.append(bare_death(prepared, [mpirun[0], *FAST_KILL, *mpirun[1:]]))
                print(f"round {i + 1}/{rounds}: job ours {wall_ours[-1]:.2f} s, bare {wall_bare[-1]:.2f} s; "
                      f"exit spread {spread[-1]:.3f} s; death to last exit ours {death[-1]:.2f} s, "
                      f"bare {death_bare[-1]:.2f} s (sigkill timeout 0: {death_bare_fast[-1]:.2f} s)", flush=True)
        finally:
            prepared.close()
            left = prepared.leftovers()
        left += [item for tag in tags for item in leftovers(tag)]
    overhead = [o - b for o, b in zip(wall_ours, wall_bare)]
    print(f"MPI job on {len(HOSTS)} local hosts x 1 process, {rounds} interleaved rounds:")
    print(f"  bare mpirun, hosts prepared   {stats(wall_bare)}")
    print(f"  ours: run_local, whole job    {stats(wall_ours)}   "
          f"(+{statistics.median(wall_ours) - statistics.median(wall_bare):.2f} s over bare; target <= 1.0)")
    print(f"  ours - bare, per round        {stats(overhead)}")
    print(f"  ours, from hosts up (info)    {stats(wall_ours_up)}   (without the namespaces' bring-up)")
    print(f"  first to last host exit       {stats(spread)}   (target <= 1; the reference sleeps 30-60)")
    print(f"  rank SIGKILL to last exit     {stats(death)}   (target <= 3)")
    print(f"  same, bare mpirun (info)      {stats(death_bare)}   (to mpirun's exit in algo-1)")
    print(f"  same, bare, sigkill 0 (info)  {stats(death_bare_fast)}   (with {' '.join(FAST_KILL)})")
    if left:
        raise SystemExit(f"left behind: {left}")
    print("  nothing left running (namespaces, processes, mounts)")


if __name__ == "__main__":
    main()
