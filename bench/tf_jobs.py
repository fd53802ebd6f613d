"""TensorFlow jobs on local clusters: our runners vs the same processes started by hand.

Three figures, from runs interleaved round by round (PS ours, PS bare, MWMS ours, MWMS bare):

1. ParameterServerStrategy job (``ps_train.py``: chief on algo-1, workers on algo-2/3, a ps on
   every host): ``run_local`` with ``sagemaker_parameter_server_enabled``, from the call to the
   last host's exit (cluster bring-up, code, join, ports, ps servers, scripts, stopping the
   servers and teardown included), vs the bare processes started by hand on a 3-host cluster that
   is already up: on each host a ps server (``python -c`` with ``tf.distribute.Server(...).join()``,
   ``CUDA_VISIBLE_DEVICES=""``) and the script, with the TF_CONFIG our runner gives (PsLayout),
   timed from starting them to the chief's exit.  The rest never end on their own, so they are
   then killed by hand (not counted: that is the chore the runner does).  Target: ours <= bare + 1.5 s.
2. MultiWorkerMirroredStrategy job (``mwms_train.py`` on 2 hosts): ``run_local`` with
   ``sagemaker_multi_worker_mirrored_strategy_enabled`` vs the two workers started by hand with
   the mwms TF_CONFIG, until both exit.  Target: ours <= bare + 1.5 s.
3. Under our runner, the chief's script end to the last host's exit: the chief's copy of
   ``ps_train.py`` appends ``time.monotonic()`` at its very end to ``SM_MODEL_DIR/chief_end``
   (CLOCK_MONOTONIC is system-wide, so it compares with ``HostResult.ended_at``).  Target: <= 1 s.

The same stamped copy of ``ps_train.py`` runs under both; the stamp is one small file write.
Lines marked (info) have no target.  Needs root and TensorFlow in the toolkit's venv.
Usage: .venv/bin/python bench/tf_jobs.py [ROUNDS]      (default 3)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON, REPO, LocalRun

from training_toolkit.local.launcher import LocalJob
from training_toolkit.local.netns import NamespaceCluster, leftovers
from training_toolkit.runners.tf_config import PsLayout, mwms_config

PS_HOSTS = ("algo-1", "algo-2", "algo-3")
MWMS_HOSTS = ("algo-1", "algo-2")
SCRIPTS = REPO / "test" / "fixtures" / "scripts"
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}
TIMEOUT_S = 300

# Appended to ps_train.py: only the chief gets there (workers serve until stopped).
STAMP = """
import time as _bench_time
with open(os.path.join(os.environ["SM_MODEL_DIR"], "chief_end"), "w") as _bench_f:
    _bench_f.write(repr(_bench_time.monotonic()))
"""

# A bare parameter server, as one would start it by hand.
PS_SERVER = """\
import json, os
import tensorflow as tf
config = json.loads(os.environ["TF_CONFIG"])
tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=config["task"]["type"],
                     task_index=config["task"]["index"], protocol="grpc", start=True).join()
"""


def base_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root"),
            **TF_ENV}


def make_src(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    (src / "ps_train.py").write_text((SCRIPTS / "ps_train.py").read_text() + STAMP)
    shutil.copy(SCRIPTS / "mwms_train.py", src / "mwms_train.py")
    return src


# -- ours ------------------------------------------------------------------------------------------


def ours(job: LocalJob, workdir: Path, tags: list[str]):
    """(seconds from the call to the last exit, from the hosts being up to it, to run_local's return, results)."""
    run = LocalRun(job, workdir, tags, timeout_s=TIMEOUT_S)
    run.check(job.hyperparameters["sagemaker_program"])
    return run.last_exit - run.started, run.last_exit - run.hosts_up, run.returned - run.started, run.results


def ps_job(src: Path) -> LocalJob:
    hps = {"sagemaker_program": json.dumps("ps_train.py"), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_parameter_server_enabled": "true"}
    return LocalJob(hosts=PS_HOSTS, hyperparameters=hps, env=TF_ENV)


def mwms_job(src: Path) -> LocalJob:
    hps = {"sagemaker_program": json.dumps("mwms_train.py"), "sagemaker_submit_directory": json.dumps(str(src)),
           "sagemaker_multi_worker_mirrored_strategy_enabled": "true"}
    return LocalJob(hosts=MWMS_HOSTS, hyperparameters=hps, env=TF_ENV)


# -- bare ------------------------------------------------------------------------------------------


def prepare(cluster: NamespaceCluster, src: Path) -> None:
    """The scripts in every host's /opt/ml/code, an empty model dir."""
    for host in cluster.hosts:
        (host.opt_ml / "code").mkdir(parents=True, exist_ok=True)
        (host.opt_ml / "model").mkdir(parents=True, exist_ok=True)
        for script in src.iterdir():
            shutil.copy(script, host.opt_ml / "code" / script.name)


class Bare:
    """Processes started by hand inside the hosts, each with its output in a log file."""

    def __init__(self, cluster: NamespaceCluster, logs: Path):
        self.cluster, self.logs = cluster, logs
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.holders = {name: set(pids) for name, pids in cluster.pids().items()}

    def start(self, host: str, what: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Each process in a session of its own, as if typed into its own shell on its host.

        It matters on a shared machine: with sched_autogroup the kernel shares the CPU between
        sessions first.  Our runner starts every script and ps server in its own session, so
        bare processes sharing the benchmark's session would get one share between them all
        while another session competes, and look seconds slower (seen: 13 s vs 8 s).
        """
        name = f"{host}-{what}"
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = self.cluster.popen(host, argv, env={**base_env(), "SM_MODEL_DIR": "/opt/ml/model", **env},
                                      cwd="/opt/ml/code", stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def fail(self, message: str) -> None:
        for name, _ in self.procs:
            sys.stdout.write(f"--- {name}\n{(self.logs / f'{name}.log').read_text(errors='replace')[-3000:]}\n")
        self.kill_all()
        raise SystemExit(f"bare: {message}")

    def wait_for(self, wanted: list[subprocess.Popen]) -> float:
        """Poll like run_local does (every 10 ms) until ``wanted`` have all exited; when the last did.

        Any process exiting before that fails the run (a bare setup would just hang).
        """
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            ended = time.monotonic()
            done = all(p.poll() is not None for p in wanted)
            died = [n for n, p in self.procs if p not in wanted and p.poll() is not None]
            if died:
                self.fail(f"{died} ended before the job did")
            if done:
                bad = [(n, p.returncode) for n, p in self.procs if p in wanted and p.returncode != 0]
                if bad:
                    self.fail(f"exit codes {bad}")
                return ended
            time.sleep(0.01)
        self.fail("timed out")
        return 0.0

    def kill_all(self) -> float:
        """SIGTERM whatever still runs (what an operator would do), SIGKILL after 10 s; seconds it took."""
        t0 = time.monotonic()
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, t0 + 10 - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        took = time.monotonic() - t0
        stray = {name: [p for p in pids if p not in self.holders.get(name, set())]
                 for name, pids in self.cluster.pids().items()}
        stray = {name: pids for name, pids in stray.items() if pids}
        if stray:
            raise SystemExit(f"bare: processes left in the hosts after the kill: {stray}")
        return took


def bare_ps(cluster: NamespaceCluster, logs: Path) -> tuple[float, float, float]:
    """(start to the chief's exit, chief's script end to its exit, kill of the rest) of one bare PS job."""
    layout = PsLayout(PS_HOSTS)
    stamp = cluster.host(PS_HOSTS[0]).opt_ml / "model" / "chief_end"
    stamp.unlink(missing_ok=True)
    bare = Bare(cluster, logs)
    t0 = time.monotonic()
    chief = None
    for host in PS_HOSTS:
        ps = layout.ps_config(host)
        if ps is not None:
            bare.start(host, "ps", [str(PYTHON), "-c", PS_SERVER],
                       {"TF_CONFIG": json.dumps(ps), "CUDA_VISIBLE_DEVICES": ""})
        proc = bare.start(host, "script", [str(PYTHON), "ps_train.py"],
                          {"TF_CONFIG": json.dumps(layout.script_config(host))})
        if host == PS_HOSTS[0]:
            chief = proc
    ended = bare.wait_for([chief])
    kill = bare.kill_all()
    return ended - t0, ended - float(stamp.read_text()), kill


def bare_mwms(cluster: NamespaceCluster, logs: Path) -> float:
    """Start to the last exit of the two bare MWMS workers."""
    bare = Bare(cluster, logs)
    t0 = time.monotonic()
    workers = [bare.start(host, "mwms", [str(PYTHON), "mwms_train.py"],
                          {"TF_CONFIG": json.dumps(mwms_config(MWMS_HOSTS, host))}) for host in MWMS_HOSTS]
    ended = bare.wait_for(workers)
    bare.kill_all()  # nothing should be left; checks it
    return ended - t0


# -- report ----------------------------------------------------------------------------------------


def stats(samples: list[float]) -> str:
    return f"median {statistics.median(samples):6.2f} s  (min {min(samples):.2f}, max {max(samples):.2f})"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    tags: list[str] = []  # of every cluster run_local brought up, to check that none is left
    f: dict[str, list[float]] = {k: [] for k in (
        "ps_ours", "ps_ours_up", "ps_ours_back", "ps_bare", "ps_spread", "chief_to_last", "bare_chief_exit",
        "bare_kill", "mw_ours", "mw_ours_up", "mw_ours_back", "mw_bare", "mw_spread")}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-tf-") as tmp_name:
        tmp = Path(tmp_name)
        src = make_src(tmp)
        prepared = NamespaceCluster(PS_HOSTS, tmp / "prepared")
        try:
            prepared.start()
            prepare(prepared, src)
            for i in range(rounds):
                wall, up, back, results = ours(ps_job(src), tmp / f"ps-{i}", tags)
                chief_end = float((results[0].model_dir / "chief_end").read_text())
                ended = [r.ended_at for r in results]
                f["ps_ours"].append(wall)
                f["ps_ours_up"].append(up)
                f["ps_ours_back"].append(back)
                f["ps_spread"].append(max(ended) - min(ended))
                f["chief_to_last"].append(max(ended) - chief_end)
                logs = tmp / f"bare-ps-{i}"
                logs.mkdir()
                wall, chief_exit, kill = bare_ps(prepared, logs)
                f["ps_bare"].append(wall)
                f["bare_chief_exit"].append(chief_exit)
                f["bare_kill"].append(kill)
                wall, up, back, results = ours(mwms_job(src), tmp / f"mwms-{i}", tags)
                ended = [r.ended_at for r in results]
                f["mw_ours"].append(wall)
                f["mw_ours_up"].append(up)
                f["mw_ours_back"].append(back)
                f["mw_spread"].append(max(ended) - min(ended))
                logs = tmp / f"bare-mwms-{i}"
                logs.mkdir()
                f["mw_bare"].append(bare_mwms(prepared, logs))
                load.append(os.getloadavg()[0])
                print(f"round {i + 1}/{rounds}: PS ours {f['ps_ours'][-1]:.2f} s, bare {f['ps_bare'][-1]:.2f} s, "
                      f"chief end to last exit {f['chief_to_last'][-1]:.2f} s; "
                      f"MWMS ours {f['mw_ours'][-1]:.2f} s, bare {f['mw_bare'][-1]:.2f} s; "
                      f"load {load[-1]:.2f}", flush=True)
        finally:
            prepared.close()
            left = prepared.leftovers()
        left += [item for tag in tags for item in leftovers(tag)]
    med = statistics.median
    ps_over = med(f["ps_ours"]) - med(f["ps_bare"])
    mw_over = med(f["mw_ours"]) - med(f["mw_bare"])
    chief = med(f["chief_to_last"])

    def verdict(value: float, target: float) -> str:
        return "met" if value <= target else "MISSED"

    def line(label: str, samples: list[float], note: str = "") -> None:
        print(f"  {label:<42}{stats(samples)}" + (f"   ({note})" if note else ""))

    print(f"TensorFlow jobs on local hosts, {rounds} interleaved rounds (1-min load avg "
          f"{min(load):.2f}-{max(load):.2f}, {os.cpu_count()} cores):")
    line("PS bare: by hand, start to chief exit", f["ps_bare"])
    line("PS ours: run_local, whole job", f["ps_ours"],
         f"{ps_over:+.2f} s over bare; target <= 1.5: {verdict(ps_over, 1.5)}")
    line("PS ours - bare, per round", [o - b for o, b in zip(f["ps_ours"], f["ps_bare"])])
    line("PS ours, from hosts up (info)", f["ps_ours_up"])
    line("PS ours, to run_local's return (info)", f["ps_ours_back"], "with the teardown")
    line("PS chief's script end to last host exit", f["chief_to_last"], f"target <= 1: {verdict(chief, 1.0)}")
    line("PS same, to the bare chief's exit (info)", f["bare_chief_exit"], "its own interpreter shutdown")
    line("PS first to last host exit (info)", f["ps_spread"])
    line("PS bare: killing the rest (info)", f["bare_kill"], "SIGTERM; not counted in bare")
    line("MWMS bare: by hand, until both exit", f["mw_bare"])
    line("MWMS ours: run_local, whole job", f["mw_ours"],
         f"{mw_over:+.2f} s over bare; target <= 1.5: {verdict(mw_over, 1.5)}")
    line("MWMS ours - bare, per round", [o - b for o, b in zip(f["mw_ours"], f["mw_bare"])])
    line("MWMS ours, from hosts up (info)", f["mw_ours_up"])
    line("MWMS ours, to run_local's return (info)", f["mw_ours_back"], "with the teardown")
    line("MWMS first to last host exit (info)", f["mw_spread"])
    if left:
        raise SystemExit(f"left behind: {left}")
    print("  nothing left running (namespaces, processes, mounts)")


if __name__ == "__main__":
    main()
