"""Goodput under host failures: ours (spare, shrinking, restarts only), torchrun elastic and Horovod elastic, side by side.

One run, one machine, one seeded fault schedule (``goodput_plan.schedule``): a whole host other than
the first killed every ~20 s for 120 s (every process in it, SIGKILL: ``test/helpers/deadhost.py``),
the platform bringing it back in the same host 15 s later; ``--scale`` multiplies every time.  The
job is fixed work: ``--steps`` steps of ``--step-s`` (DDP on gloo, one process per host, a tiny model:
``goodput_jobs.TORCH_JOB``), a checkpoint every ``--ckpt-every`` steps to a shared directory, resumed
on restart.  Goodput = steps x step length / the job's wall time (start to the first host's end).

- ours, spare: 5 hosts, ``TRAINING_TOOLKIT_MAX_HOSTS=4`` (4 active + 1 spare); a host back from
  its kill joins as a spare;
- ours, shrinking: 4 hosts, ``TRAINING_TOOLKIT_MIN_HOSTS=2``: goes on with 3 (each step then 4/3 as
  long), a host back is seated at the next restart;
- ours, restarts only (today's default: no spare, MIN = MAX): each loss restarts the job, whose
  barrier waits for the host to come back;
- torchrun: ``--nnodes 2:4 --max-restarts N``, c10d rendezvous on algo-1, one torchrun per host,
  the killed host's torchrun started again when it is back (its defaults otherwise);
- horovodrun elastic (``goodput_horovod.py``): ``--min-np 2 --max-np 4``, a discovery script listing
  the hosts up, sshd on every host; Horovod commits its state in memory every ``--ckpt-every`` steps.

Also: each kill to every rank of the next attempt running, ours (from the ranks' stamps), and the same
job with no fault at all (``ours-nofault``: what the machine's load makes of the work's length).
Needs root, torch, horovod (gloo), openssh-server.
Usage: .venv/bin/python bench/goodput.py [--scale 1] [--seed 1] [--steps N] [--only ours-spare,torchrun,...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON, REPO
from goodput_jobs import H4, TAGS, TORCH_JOB, Faults, Outcome, StampedLog, decisions, job_env, running
from goodput_plan import record_splits, recoveries, row, schedule, work_s

sys.path.insert(0, str(REPO / "test"))
from helpers.deadhost import HostKiller  # noqa: E402

from training_toolkit.local.launcher import LocalJob, run_local  # noqa: E402
from training_toolkit.local.netns import NamespaceCluster, leftovers  # noqa: E402

H5 = (*H4, "algo-5")
SCRIPT = "goodput_torch.py"
OURS = {"ours-spare": ("ours, 4 active + 1 spare", H5, {"TRAINING_TOOLKIT_MAX_HOSTS": "4"}),
        "ours-shrink": ("ours, shrinking (4 hosts, MIN_HOSTS=2)", H4, {"TRAINING_TOOLKIT_MIN_HOSTS": "2"}),
        "ours-restart": ("ours, restarts only (4 hosts, MIN=MAX)", H4, {}),
        "ours-nofault": ("ours, no fault (the same job, nothing killed)", H4, {})}


def started(shared: Path) -> dict[int, list[float]]:
    """Each attempt's ranks' start stamps."""
    out: dict[int, list[float]] = {}
    for f in shared.glob("started-*"):
        out.setdefault(int(f.name.split("-")[1]), []).append(float(f.read_text()))
    return out


def ours(key: str, tmp: Path, plan, args) -> Outcome:
    label, hosts, extra = OURS[key]
    src, shared = tmp / "src", tmp / "shared"
    src.mkdir(parents=True)
    shared.mkdir()
    (src / SCRIPT).write_text(TORCH_JOB)
    env = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": str(max(30, round(40 * args.scale))), "TRAINING_TOOLKIT_GRACE_PERIOD": "5",
           "TRAINING_TOOLKIT_MAX_RESTARTS": "30", **job_env(shared, args), **extra}
    hps = {"sagemaker_program": f'"{SCRIPT}"', "sagemaker_submit_directory": f'"{src}"',
           "sagemaker_torch_distributed_enabled": "true", "sagemaker_distributed_processes_per_host": "1"}
    killer = HostKiller()
    plan = [] if key == "ours-nofault" else plan
    faults = Faults(plan, hosts[0], running=lambda: running(killer.cluster, SCRIPT), kill=lambda h: killer.kill(h),
                    shared=shared)
    first: dict = {}

    def on_start(procs) -> None:
        if not first:
            TAGS.append(killer.cluster.tag)
            first["t0"], first["proc"] = time.monotonic(), procs[hosts[0]]
            faults.start(hosts)

    def restart(name: str, code: int) -> float | None:  # the platform's replacement, in the same host
        if name not in faults.down or first["proc"].poll() is not None:
            return None
        return max(0.0, faults.down[name] - time.monotonic())

    log = StampedLog(tmp / "ours.log")
    try:
        results = run_local(LocalJob(hosts=hosts, env=env, hyperparameters=hps), tmp / "cluster", environ=os.environ,
                            timeout_s=600 + 4 * args.steps * args.step_s,
                            out=log, before_start=killer.before_start, on_start=on_start, restart=restart)
    finally:
        log.close()
    faults.stop()
    head = results[0]
    if faults.errors or head.exit_code != 0 or not (shared / "done").exists():
        return Outcome(label, None, f"failed: {head.exit_code} {head.failure} {faults.errors} (log {tmp / 'ours.log'})",
                       faults.kills)
    said = decisions(tmp / "ours.log", hosts[0])  # the first host's choice of each restart's hosts
    to_choice = [min((t for t in said if t > at), default=None) for _, at in faults.kills]
    outcome = Outcome(label, head.ended_at - first["t0"], "", faults.kills, recoveries(faults.kills, started(shared)))
    outcome.to_choice = [c - at for c, (_, at) in zip(to_choice, faults.kills) if c is not None]
    # each kill's split as the job's record has it (the lead's: the first host's), beside the outside timing
    wall_now, mono_now = time.time(), time.monotonic()
    kills_wall = [(host, wall_now - (mono_now - at)) for host, at in faults.kills]
    lead = head.host
    cost_file = head.opt_ml / "output" / "data" / "training-toolkit" / f"cost-{lead}.json"
    outcome.splits = record_splits(kills_wall, json.loads(cost_file.read_text())["faults"]) if cost_file.exists() else []
    return outcome


def torchrun(tmp: Path, plan, args) -> Outcome:
    label = "torchrun --nnodes 2:4, c10d"
    shared = tmp / "shared"
    shared.mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root"),
           # torchrun 2.x's restarted workers otherwise read the last attempt's addresses (docs/benchmarks.md)
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **job_env(shared, args)}
    cmd = [str(PYTHON), "-m", "torch.distributed.run", "--nnodes", "2:4", "--nproc-per-node", "1",
           "--max-restarts", "30", "--rdzv-backend", "c10d", "--rdzv-endpoint", "algo-1:29400", "--rdzv-id", "goodput",
           f"/opt/ml/code/{SCRIPT}"]
    with NamespaceCluster(H4, tmp / "cluster") as cluster:
        killer = HostKiller()
        killer.before_start(cluster)
        TAGS.append(cluster.tag)
        for host in cluster.hosts:
            (host.opt_ml / "code").mkdir(parents=True, exist_ok=True)
            (host.opt_ml / "code" / SCRIPT).write_text(TORCH_JOB)
        procs, logs = {}, []

        def start(name: str) -> None:
            if "algo-1" in procs and procs["algo-1"].poll() is not None:
                return  # the job is over: no replacement
            logs.append(open(tmp / f"torchrun-{name}-{len(logs)}.log", "wb"))  # noqa: SIM115
            procs[name] = cluster.popen(name, cmd, env=env, cwd="/opt/ml/code", stdout=logs[-1],
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        faults = Faults(plan, "algo-1", running=lambda: running(cluster, SCRIPT), kill=lambda h: killer.kill(h),
                        back=start, shared=shared)
        t0 = time.monotonic()
        for name in H4:
            start(name)
        faults.start(H4)
        try:
            code = procs["algo-1"].wait(timeout=600 + 4 * args.steps * args.step_s)
        except subprocess.TimeoutExpired:
            code = None
        wall = time.monotonic() - t0
        faults.stop()
        for name in H4[1:]:
            try:
                procs[name].wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            killer.kill(name)
        killer.kill("algo-1")
        for log in logs:
            log.close()
    if code != 0 or not (shared / "done").exists() or faults.errors:
        return Outcome(label, None, f"failed: exit {code} {faults.errors} (logs {tmp}/torchrun-*.log)", faults.kills)
    return Outcome(label, wall, "", faults.kills)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0, help="every time of the fault schedule times this")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, help="default: 150 s of work x scale")
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--ckpt-every", type=int, default=6)
    parser.add_argument("--keep", type=Path, help="keep every job's logs and files under this new directory")
    parser.add_argument("--only", default="ours-nofault,ours-spare,ours-shrink,ours-restart,torchrun,horovod")
    args = parser.parse_args()
    args.steps = args.steps or round(150 * args.scale / args.step_s)
    plan = schedule(args.seed, args.scale)
    work = work_s(args.steps, args.step_s)
    print(f"schedule (seed {args.seed}, scale {args.scale:g}): kills at "
          + ", ".join(f"{f.at_s:.1f}" for f in plan) + f" s, each host back {15 * args.scale:g} s later; "
          f"work {args.steps} x {args.step_s:g} s = {work:g} s; load average {os.getloadavg()}", flush=True)
    outcomes: list[Outcome] = []
    with (tempfile.TemporaryDirectory(prefix="bench-goodput-") if args.keep is None
          else contextlib.nullcontext(str(args.keep))) as tmp:
        for key in args.only.split(","):
            where = Path(tmp) / key
            if key in OURS:
                outcome = ours(key, where, plan, args)
            elif key == "torchrun":
                outcome = torchrun(where, plan, args)
            elif key == "horovod":
                from goodput_horovod import horovod

                outcome = horovod(where, plan, args)
            else:
                raise SystemExit(f"unknown system {key}")
            outcomes.append(outcome)
            wall = f"{outcome.wall:.1f} s" if outcome.wall is not None else outcome.note
            kills = [(h, round(t - outcome.kills[0][1], 1)) for h, t in outcome.kills]
            print(f"{outcome.label}: {wall}; kills (host, s after the first) {kills}"
                  f"; load {os.getloadavg()[0]:.1f}", flush=True)
            if outcome.wall is None:
                print((where / "ours.log").read_text(errors="replace")[-3000:] if (where / "ours.log").exists() else "")
    print(f"\ngoodput, work {work:g} s, {len(plan)} kills scheduled (seed {args.seed}, scale {args.scale:g}), "
          f"load average {os.getloadavg()}:")
    print(f"  {'system':44s} {'wall':>8s} {'goodput':>8s}")
    for o in outcomes:
        print(row(o.label, work, o.wall, o.note if o.wall is None else f"{len(o.kills)} kills"))
    for o in outcomes:
        got = [r for r in o.recover if r is not None]
        if got:
            print(f"  {o.label}: kill to every rank of the next attempt running: "
                  f"median {statistics.median(got):.2f} s (min {min(got):.2f}, max {max(got):.2f}; "
                  f"{len(got)} of {len(o.recover)} kills)")
        for kill, split, outside in zip(o.kills, getattr(o, "splits", []), o.recover):
            if split is not None:  # the record's split, and its sum against the ranks' own stamps from outside
                print(f"  {o.label}: {kill[0]} killed: the record: seen {split['outside_detection_s']:.2f} s after the "
                      f"kill (detection {split['detection_s']:.2f}), barrier {split['barrier_s']:.2f}, ranks' start "
                      f"{split['start_s']:.2f}: first progress {split['to_progress_s']:.2f} s after the kill"
                      + (f"; every rank running {outside:.2f} s after it (outside)" if outside is not None else ""))
        if getattr(o, "to_choice", None):
            print(f"  {o.label}: kill to the first host's choice of the next attempt's hosts: "
                  f"median {statistics.median(o.to_choice):.2f} s (min {min(o.to_choice):.2f}, max {max(o.to_choice):.2f})")
    left = [item for tag in TAGS for item in leftovers(tag)]
    print("  nothing left running (namespaces, processes, mounts)" if not left else f"  LEFT BEHIND: {left}")
    if left:
        raise SystemExit(f"left behind: {left}")


if __name__ == "__main__":
    main()
