"""Goodput under host failures: ours (spare, shrinking, restarts only), torchrun elastic and Horovod elastic, side by side.

One machine, one seeded fault schedule (``goodput_plan.schedule``): a whole host killed every
``--period`` seconds (every process in it, SIGKILL: ``test/helpers/deadhost.py``), never the first
host, except with ``--first-too`` (schedule (c), ours only), the platform bringing it back in the same
host 15 s later; ``--scale`` multiplies every time.  The schedules of docs/benchmarks.md: (a)
``--period 60``, (b) ``--period 20``, (c) ``--period 20 --first-too``, and (c) at (a)'s cadence
``--period 60 --first-too --seed 2`` (seed 1's two kills at that cadence miss the first host).  ``--runs N`` runs each system
N times, one after another; the table gives medians with min-max.  The job is fixed work: ``--steps``
steps of ``--step-s`` (DDP on gloo, one process per host, a tiny model: ``goodput_jobs.TORCH_JOB``), a
checkpoint every ``--ckpt-every`` steps to a shared directory, resumed on restart.  Goodput = steps x
step length / the job's wall time (start to the first host's end with the verdict).

- ours, spare: 5 hosts, ``TRAINING_TOOLKIT_MAX_HOSTS=4`` (4 active + 1 spare); a host back from
  its kill joins as a spare;
- ours, shrinking: 4 hosts, ``TRAINING_TOOLKIT_MIN_HOSTS=2``: goes on with 3 (each step then 4/3 as
  long), a host back is seated at the next restart;
- ours, restarts only (today's default: no spare, MIN = MAX): each loss restarts the job, whose
  barrier waits for the host to come back;
- torchrun (``torchrun``, on its defaults; ``torchrun-tuned``, for fast recovery: ``TORCHRUN_TUNED_*``):
  ``--nnodes 2:4 --max-restarts 100``, c10d rendezvous on algo-1, one torchrun per host, the killed
  host's torchrun started again when it is back;
- horovodrun elastic (``goodput_horovod.py``): ``--min-np 2 --max-np 4``, a discovery script listing
  the hosts up, sshd on every host; Horovod commits its state in memory every ``--ckpt-every`` steps.

Also, for every system, each kill to a rank and to every rank of the next attempt running (the ranks'
own stamps, grouped into attempts by time), ours' split of each kill from its record, and the same job
with no fault at all (``ours-nofault``: what the machine makes of the work's length).
Needs root, torch, horovod (gloo), openssh-server.
Usage: .venv/bin/python bench/goodput.py [--period 20] [--first-too] [--runs 3] [--scale 1] [--seed 1] [--steps N]
       [--only ours-nofault,ours-spare,torchrun,torchrun-tuned,horovod,...] [--keep DIR]
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
from goodput_jobs import H4, TAGS, TORCH_JOB, Faults, Outcome, StampedLog, decisions, job_env, running, timed
from goodput_plan import record_splits, schedule, spread, work_s

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
    faults = Faults(plan, None if args.first_too else hosts[0], running=lambda: running(killer.cluster, SCRIPT),
                    kill=lambda h: killer.kill(h), shared=shared)
    first: dict = {}

    def on_start(procs) -> None:
        if not first:
            TAGS.append(killer.cluster.tag)
            first["t0"], first["proc"] = time.monotonic(), procs[hosts[0]]
            faults.start(hosts)

    def restart(name: str, code: int) -> float | None:  # the platform's replacement, in the same host
        if name not in faults.down or (shared / "done").exists():
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
    ended = [r.ended_at for r in results if r.exit_code == 0 and r.ended_at is not None]
    if faults.errors or len(ended) != len(results) or not (shared / "done").exists():
        failed = [(r.host, r.exit_code, r.failure) for r in results if r.exit_code != 0]
        return Outcome(label, None, f"failed: {failed} {faults.errors} (log {tmp / 'ours.log'})", faults.kills)
    said = decisions(tmp / "ours.log", hosts)  # the lead's choice of each restart's hosts, whichever host led
    to_choice = [min((t for t in said if t > at), default=None) for _, at in faults.kills]
    outcome = timed(Outcome(label, min(ended) - first["t0"], "", faults.kills), shared)
    outcome.to_choice = [c - at for c, (_, at) in zip(to_choice, faults.kills) if c is not None]
    # each kill's split as the job's record has it, beside the outside timing: the record of the host that led the
    # last attempt (after a failover the next lead carries the record on; the checkpoint marks of the ranks it led)
    wall_now, mono_now = time.time(), time.monotonic()
    kills_wall = [(host, wall_now - (mono_now - at)) for host, at in faults.kills]
    costs = {r.host: json.loads(path.read_text()) for r in results
             if (path := r.opt_ml / "output" / "data" / "training-toolkit" / f"cost-{r.host}.json").exists()}
    led_last = [cost for host, cost in costs.items() if cost["attempts"] and cost["attempts"][-1].get("lead") == host]
    lead_cost = led_last[0] if led_last else {"faults": []}
    outcome.splits = record_splits(kills_wall, lead_cost["faults"])
    outcome.record_goodput = lead_cost.get("goodput")  # the record's own (the job marks its checkpoints)
    return outcome


#: torchrun tuned for fast recovery, each setting as torch documents it (docs/benchmarks.md names where)
TORCHRUN_TUNED_RDZV = ("join_timeout=120,last_call_timeout=1,close_timeout=5,read_timeout=10,"
                       "keep_alive_interval=1,keep_alive_max_attempt=3")
TORCHRUN_TUNED_ENV = {"TORCH_ELASTIC_WORKER_IDENTICAL": "1",  # no role exchange through the store (api.py)
                      "GLOO_TIMEOUT_S": "10"}  # the job's own process group timeout (goodput_jobs.TORCH_JOB)


def torchrun(tmp: Path, plan, args, tuned: bool = False) -> Outcome:
    label = "torchrun --nnodes 2:4, c10d" + (", tuned" if tuned else ", defaults")
    shared = tmp / "shared"
    shared.mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root"),
           # torchrun 2.x's restarted workers otherwise read the last attempt's addresses (docs/benchmarks.md)
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **job_env(shared, args),
           **(TORCHRUN_TUNED_ENV if tuned else {})}
    cmd = [str(PYTHON), "-m", "torch.distributed.run", "--nnodes", "2:4", "--nproc-per-node", "1",
           "--max-restarts", "100", "--rdzv-backend", "c10d", "--rdzv-endpoint", "algo-1:29400", "--rdzv-id", "goodput",
           *(("--rdzv-conf", TORCHRUN_TUNED_RDZV, "--monitor-interval", "0.1") if tuned else ()),
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
    return timed(Outcome(label, wall, "", faults.kills), shared)


SYSTEMS = (*OURS, "torchrun", "torchrun-tuned", "horovod")


def run_system(key: str, where: Path, plan, args) -> Outcome:
    if key in OURS:
        return ours(key, where, plan, args)
    if key in ("torchrun", "torchrun-tuned"):
        return torchrun(where, plan, args, tuned=key == "torchrun-tuned")
    from goodput_horovod import horovod

    return horovod(where, plan, args)


def report(outcomes: dict[str, list[Outcome]], work: float) -> None:
    """Each system over its runs: goodput (median, min-max), over the no-fault run's, and each kill's cost."""
    def goodputs(key: str) -> list[float]:
        return [work / o.wall for o in outcomes.get(key, []) if o.wall is not None]

    base = goodputs("ours-nofault")
    print(f"  {'system':44s} {'finished':>8s}  {'goodput':22s} {'over no-fault':22s}")
    for key, runs in outcomes.items():
        got = goodputs(key)
        over = [g / statistics.median(base) for g in got] if base and key != "ours-nofault" else []
        print(f"  {runs[0].label:44s} {len(got)}/{len(runs):<6d}  {spread(got):22s} {spread(over):22s}")
        for o in runs:
            if o.wall is None:
                print(f"      a run that did not finish: {o.note}")
    for runs in outcomes.values():
        label = runs[0].label
        for name, attr in (("a rank", "first_rank"), ("every rank", "recover")):
            got = [r for o in runs for r in getattr(o, attr, []) if r is not None]
            kills = sum(len(o.kills) for o in runs)
            if got:
                print(f"  {label}: kill to {name} of the next attempt running: {spread(got, ' s', 2)}; "
                      f"{len(got)} of {kills} kills")
        splits = [sp for o in runs for sp in getattr(o, "splits", []) if sp is not None]
        if splits:
            parts = ", ".join(f"{name} {spread([sp[k] for sp in splits], ' s', 2)}" for name, k in (
                ("detection (outside)", "outside_detection_s"), ("barrier", "barrier_s"), ("ranks' start", "start_s"),
                ("first progress", "to_progress_s")))
            print(f"  {label}: the record's split of each kill: {parts}; {len(splits)} kills")
        said = [o.record_goodput for o in runs if getattr(o, "record_goodput", None) is not None]
        if said:  # the job's record: ranks' running time less the work redone, over the wall from the first entry
            print(f"  {label}: goodput as the job's record has it: {spread(said)}; from outside: "
                  f"{spread([work / o.wall for o in runs if o.wall is not None])}")
        choice = [c for o in runs for c in getattr(o, "to_choice", [])]
        if choice:
            print(f"  {label}: kill to the lead's choice of the next attempt's hosts: {spread(choice, ' s', 2)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0, help="every time of the fault schedule times this")
    parser.add_argument("--period", type=float, default=20.0, help="seconds between kills: (a) 60, (b) 20")
    parser.add_argument("--first-too", action="store_true", help="(c): the first host among the victims (ours only)")
    parser.add_argument("--runs", type=int, default=1, help="each system this many times, one after another")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, help="default: 150 s of work x scale")
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--ckpt-every", type=int, default=6)
    parser.add_argument("--keep", type=Path, help="keep every job's logs and files under this new directory")
    parser.add_argument("--only", default="ours-nofault,ours-spare,ours-shrink,ours-restart,torchrun,horovod")
    args = parser.parse_args()
    keys = args.only.split(",")
    unknown = [k for k in keys if k not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system {unknown}: choose among {', '.join(SYSTEMS)}")
    if args.first_too and any(k not in OURS for k in keys):
        raise SystemExit("--first-too (schedule c) is ours only: the others' first host holds their rendezvous")
    args.steps = args.steps or round(150 * args.scale / args.step_s)
    plan = schedule(args.seed, args.scale, period_s=args.period, span_s=max(120.0, args.period * 2))
    work = work_s(args.steps, args.step_s)
    print(f"schedule (seed {args.seed}, scale {args.scale:g}, every {args.period:g} s"
          f"{', the first host among the victims' if args.first_too else ''}): kills at "
          + ", ".join(f"{f.at_s:.1f}" for f in plan) + f" s, each host back {15 * args.scale:g} s later; "
          f"work {args.steps} x {args.step_s:g} s = {work:g} s; {args.runs} run(s) each; "
          f"load average {os.getloadavg()}", flush=True)
    outcomes: dict[str, list[Outcome]] = {}
    with (tempfile.TemporaryDirectory(prefix="bench-goodput-") if args.keep is None
          else contextlib.nullcontext(str(args.keep))) as tmp:
        for run in range(args.runs):
            for key in keys:
                where = Path(tmp) / f"{key}-{run}"
                outcome = run_system(key, where, plan, args)
                outcomes.setdefault(key, []).append(outcome)
                wall = f"{outcome.wall:.1f} s" if outcome.wall is not None else outcome.note
                kills = [(h, round(t - outcome.kills[0][1], 1)) for h, t in outcome.kills]
                print(f"run {run + 1}, {outcome.label}: {wall}; kills (host, s after the first) {kills}"
                      f"; load {os.getloadavg()[0]:.1f}", flush=True)
                if outcome.wall is None and (where / "ours.log").exists():
                    print((where / "ours.log").read_text(errors="replace")[-3000:])
    print(f"\ngoodput, work {work:g} s, {len(plan)} kills scheduled (seed {args.seed}, every {args.period:g} s, "
          f"scale {args.scale:g}), {args.runs} run(s) each, load average {os.getloadavg()}:")
    report(outcomes, work)
    left = [item for tag in TAGS for item in leftovers(tag)]
    print("  nothing left running (namespaces, processes, mounts)" if not left else f"  LEFT BEHIND: {left}")
    if left:
        raise SystemExit(f"left behind: {left}")


if __name__ == "__main__":
    main()
