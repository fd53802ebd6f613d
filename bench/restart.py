"""Restart: time from a rank's SIGKILL to every rank of attempt 2 running, ours against torchrun, same hosts.

A 2-host x 2-process torch.distributed job (CPU, gloo; test/fixtures/scripts/torch_restart.py): rank 3
SIGKILLs itself at step 2 of attempt 0; one restart allowed.  Each rank stamps the wall clock once its
process group is up (``started-ATTEMPT-RANK``), the dying rank just before its death (``killed``).
Figure: max(started-1-*) - killed, i.e. until the last rank of attempt 2 is in its process group.

- ours: ``run_local`` with ``sagemaker_torch_distributed_enabled`` and TRAINING_TOOLKIT_MAX_RESTARTS=1;
- torchrun: ``python -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --max-restarts 1`` with the c10d
  rendezvous on algo-1, one per host of a local cluster of the same shape (no toolkit);
- (info) ours with MPI (mpi4py, tests' mpi_stall.py with FAULT=kill): torchrun has no MPI counterpart.

Rounds interleave ours and torchrun.  Needs root, torch; MPI lines need Open MPI, sshd, mpi4py.
Usage: .venv/bin/python bench/restart.py [ROUNDS]   (default 3)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PYTHON
from resilience_common import Recorder, hps, source, stamps

from training_toolkit.local.launcher import LocalJob, run_local
from training_toolkit.local.netns import NamespaceCluster

HOSTS = ("algo-1", "algo-2")
FAULT = {"FAULT_RANK": "3", "FAULT_STEP": "2", "STEP_S": "0.2"}
RDZV = "c10d"  # torchrun's rendezvous: "static" (--master-addr) or "c10d"; see docs/benchmarks.md


def restart_time(model_dirs) -> float:
    return max(stamps(model_dirs, "started-1-*")) - stamps(model_dirs, "killed")[0]


def ours_torch(tmp: Path, hosts=HOSTS, per_host: int = 2) -> float:
    src = source(tmp, "torch_restart.py")
    job = LocalJob(hosts=hosts, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TRAINING_TOOLKIT_MAX_RESTARTS": "1", **FAULT},
                   hyperparameters=hps("torch_restart.py", src, sagemaker_torch_distributed_enabled=True,
                                       sagemaker_distributed_processes_per_host=per_host))
    out = Recorder()
    results = run_local(job, tmp / "cluster", environ=os.environ, timeout_s=240, out=out)
    if any(r.exit_code != 0 for r in results) or any(r.survivors for r in results):
        raise SystemExit(f"ours (torch): {[r.exit_code for r in results]} {[r.failure for r in results]}\n{out.text()}")
    return restart_time([r.model_dir for r in results])


def ours_mpi(tmp: Path) -> float:
    src = source(tmp, "mpi_stall.py")
    job = LocalJob(hosts=HOSTS, env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TRAINING_TOOLKIT_MAX_RESTARTS": "1",
                                     "FAULT": "kill", **FAULT},
                   hyperparameters=hps("mpi_stall.py", src, sagemaker_mpi_enabled=True,
                                       sagemaker_mpi_num_of_processes_per_host=2))
    out = Recorder()
    results = run_local(job, tmp / "cluster", environ=os.environ, timeout_s=240, out=out)
    if [r.exit_code for r in results] != [0, 0] or any(r.survivors for r in results):
        raise SystemExit(f"ours (mpi): {[r.exit_code for r in results]} {[r.failure for r in results]}\n{out.text()}")
    return restart_time([r.model_dir for r in results])


def torchrun(tmp: Path, hosts=HOSTS, per_host: int = 2) -> float | str:
    """The restart time under torchrun, or why there is none (torchrun's own job failed: its log's last error)."""
    src = source(tmp, "torch_restart.py")
    with NamespaceCluster(hosts, tmp / "torchrun") as cluster:
        for host in cluster.hosts:
            (host.opt_ml / "code").mkdir(parents=True, exist_ok=True)
            (host.opt_ml / "model").mkdir(parents=True, exist_ok=True)
            (host.opt_ml / "code" / "torch_restart.py").write_text((src / "torch_restart.py").read_text())
        # Without it torchrun 2.x's restarted workers read the previous attempt's addresses from the rendezvous
        # store they share, and fail to connect (pytorch/pytorch#135712, #167288): torchrun's documented workaround.
        env = {"PATH": "/usr/bin:/bin", "OUT_DIR": "/opt/ml/model", "OMP_NUM_THREADS": "1",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **FAULT}
        def cmd(node_rank: int) -> list[str]:
            if len(hosts) == 1:
                rendezvous = ["--standalone"]
            elif RDZV == "c10d":
                rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "algo-1:29400", "--rdzv-id", "bench"]
            else:
                rendezvous = ["--node-rank", str(node_rank), "--master-addr", "algo-1", "--master-port", "29500"]
            return [str(PYTHON), "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
                    "--nproc-per-node", str(per_host),
                    "--max-restarts", "1", *rendezvous, "/opt/ml/code/torch_restart.py"]

        logs = [open(tmp / f"torchrun-{host.name}.log", "wb") for host in cluster.hosts]  # noqa: SIM115
        procs = [cluster.popen(host, cmd(i), env=env, cwd="/opt/ml/code", stdout=log, stderr=subprocess.STDOUT)
                 for i, (host, log) in enumerate(zip(cluster.hosts, logs))]
        try:
            codes = [p.wait(timeout=180) for p in procs]
        except subprocess.TimeoutExpired:
            codes = None
        for log in logs:
            log.close()
        if codes is None or any(codes):
            text = "\n".join((tmp / f"torchrun-{h}.log").read_text(errors="replace") for h in hosts)
            errors = [line.strip() for line in text.splitlines() if line.startswith("RuntimeError")]
            return f"failed, exit codes {codes}: {errors[-1][:160] if errors else 'no RuntimeError line'}"
        return restart_time([host.opt_ml / "model" for host in cluster.hosts])


def stats(samples: list) -> str:
    failed = [s for s in samples if isinstance(s, str)]
    samples = [s for s in samples if not isinstance(s, str)]
    if not samples:
        return f"no figure: every run failed ({failed[0]})"
    extra = f"; {len(failed)} of {len(failed) + len(samples)} runs failed: {failed[0]}" if failed else ""
    return f"median {statistics.median(samples):6.2f} s  (min {min(samples):.2f}, max {max(samples):.2f}){extra}"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with_mpi = "--no-mpi" not in sys.argv
    figures: dict[str, list] = {"ours": [], "torchrun": [], "ours1": [], "torchrun1": [], "mpi": []}
    one = ("algo-1",)
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
            figures["ours"].append(ours_torch(Path(tmp) / "ours"))
            figures["torchrun"].append(torchrun(Path(tmp) / "torchrun"))
            figures["ours1"].append(ours_torch(Path(tmp) / "ours1", one, 4))
            figures["torchrun1"].append(torchrun(Path(tmp) / "torchrun1", one, 4))
            if with_mpi:
                figures["mpi"].append(ours_mpi(Path(tmp) / "mpi"))
        print(f"round {i + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.2f} s" if not isinstance(v[-1], str) else f"{k} {v[-1]}"
                                                      for k, v in figures.items() if v), flush=True)
    print(f"SIGKILL of rank 3 to every rank of attempt 2 in its process group (gloo), {rounds} rounds:")
    print(f"  2 hosts x 2, torchrun --max-restarts 1 ({RDZV} rendezvous)  {stats(figures['torchrun'])}")
    print(f"  2 hosts x 2, ours, torch_distributed          {stats(figures['ours'])}   (target: no slower)")
    print(f"  1 host x 4, torchrun --standalone --max-restarts 1  {stats(figures['torchrun1'])}")
    print(f"  1 host x 4, ours, torch_distributed                 {stats(figures['ours1'])}")
    if with_mpi:
        print(f"  ours, MPI (info)            {stats(figures['mpi'])}   (to every rank past MPI_Init; no peer to compare)")
    print("  (a loaded machine: shared with other test runs; figures are noisy)")


if __name__ == "__main__":
    main()
