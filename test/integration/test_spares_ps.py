"""Spares and a job that shrinks for TensorFlow parameter servers, end to end: real train, TF2
ParameterServerStrategy with the toolkit's own ps servers on local hosts, a host killed whole.

A host is killed as a node dies (``helpers/deadhost.py``): every process in it at once (its ``train``,
its worker's server, its ps server), mid-run.  ``TF_CONFIG`` is each attempt's: built from its
active hosts (docs/contract.md).  Nothing asserts a duration: the machine runs other work at the same time.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from helpers.deadhost import HostKiller, kill_when
from helpers.multihost import hps, run, source_dir
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.tensorflow]

H3 = ("algo-1", "algo-2", "algo-3")
H4 = (*H3, "algo-4")
BASE = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TRAINING_TOOLKIT_GRACE_PERIOD": "5", "TF_CPP_MIN_LOG_LEVEL": "2",
        "TRAINING_TOOLKIT_MAX_RESTARTS": "1", "EPOCHS": "16", "EPOCH_S": "0.5"}


def ps_job(tmp_path: Path, env: dict, hosts: tuple[str, ...] = H3) -> tuple[LocalJob, Path]:
    src = source_dir(tmp_path, "ps_spares.py")
    shared = tmp_path / "shared"
    shared.mkdir()
    return LocalJob(hosts=hosts, env={**BASE, "SHARED_DIR": str(shared), **env},
                    hyperparameters=hps("ps_spares.py", src, sagemaker_parameter_server_enabled=True)), shared


def kill_at_epoch(killer: HostKiller, shared: Path, epoch: int, host: str) -> threading.Thread:
    """Kill ``host`` whole once attempt 0's chief has finished ``epoch`` epochs (a thread; join it after the job)."""
    return kill_when(killer, shared / "epoch-0", epoch, host, timeout_s=300)


def seen(shared: Path, attempt: int) -> dict[str, dict]:
    """``chief-0``/``worker-N`` -> what that task wrote in ``attempt``."""
    return {f.name.split("-", 2)[2].removesuffix(".json"): json.loads(f.read_text())
            for f in shared.glob(f"seen-{attempt}-*.json")}


def cluster(chief: str, workers: list[str], ps: list[str]) -> dict:
    return {"chief": [f"{chief}:2222"], "worker": [f"{h}:2222" for h in workers], "ps": [f"{h}:2223" for h in ps]}


def finished(shared: Path, attempt: int) -> dict:
    done = json.loads((shared / f"done-{attempt}.json").read_text())
    assert abs(done["w"] - 3.0) < 0.3 and abs(done["b"] + 1.0) < 0.3, done  # it learnt y = 3x - 1
    return done


def test_a_spare_takes_the_seat_of_a_worker_and_ps_host_killed_whole_and_the_chief_resumes(tmp_path, capfd):
    job, shared = ps_job(tmp_path, {"TRAINING_TOOLKIT_MAX_HOSTS": "2"})
    killer = HostKiller()
    killing = kill_at_epoch(killer, shared, 3, "algo-2")
    results = {r.host: r for r in run(job, tmp_path, timeout_s=420, before_start=killer.before_start)}
    killing.join(5)
    assert not killing.errors, killing.errors
    assert list(killer.killed) == ["algo-2"]
    for host in ("algo-1", "algo-3"):  # the chief and the spare, seated
        assert results[host].exit_code == 0, (host, results[host].failure)
    first = seen(shared, 0)  # the spare ran nothing: no worker of its own, no ps
    assert sorted(first) == ["chief-0", "worker-0"] and first["worker-0"]["host"] == "algo-2"
    assert first["chief-0"]["cluster"] == cluster("algo-1", ["algo-2"], ["algo-1", "algo-2"])
    second = seen(shared, 1)  # algo-3 in algo-2's seat: worker 0 and ps 1
    assert sorted(second) == ["chief-0", "worker-0"] and second["worker-0"]["host"] == "algo-3"
    for task in second.values():
        assert task["cluster"] == cluster("algo-1", ["algo-3"], ["algo-1", "algo-3"]), task
        assert task["sm_hosts"] == ["algo-1", "algo-3"], task
    assert second["chief-0"]["start"] >= 3 and second["chief-0"]["w"] != 0.0  # resumed from its checkpoint
    assert finished(shared, 1)["start"] == second["chief-0"]["start"]
    assert not list(shared.glob("seen-2-*")) and not (shared / "done-0.json").exists()
    out = capfd.readouterr().out
    assert "algo-3: a spare: waiting (attempt 1 runs on algo-1, algo-2)" in out
    assert "algo-3: seated in attempt 2 (rank order: algo-1, algo-3)" in out


def test_without_a_spare_the_ps_job_shrinks_to_the_minimum_with_one_ps_fewer_and_completes(tmp_path):
    job, shared = ps_job(tmp_path, {"TRAINING_TOOLKIT_MIN_HOSTS": "2"})
    killer = HostKiller()
    killing = kill_at_epoch(killer, shared, 3, "algo-2")
    results = {r.host: r for r in run(job, tmp_path, timeout_s=420, before_start=killer.before_start)}
    killing.join(5)
    assert not killing.errors, killing.errors
    for host in ("algo-1", "algo-3"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    first = seen(shared, 0)
    assert first["chief-0"]["cluster"] == cluster("algo-1", ["algo-2", "algo-3"], list(H3))
    second = seen(shared, 1)  # two hosts left: algo-3 renumbered worker 0, two ps servers instead of three
    assert sorted(second) == ["chief-0", "worker-0"] and second["worker-0"]["host"] == "algo-3"
    assert all(t["cluster"] == cluster("algo-1", ["algo-3"], ["algo-1", "algo-3"]) for t in second.values()), second
    assert second["chief-0"]["start"] >= 3  # the variables were on three ps; restored onto two
    finished(shared, 1)


def test_the_chiefs_host_killed_whole_fails_over_the_chief_to_the_next_lead(tmp_path, capfd):
    """The lead runs the chief: killed whole, algo-2 leads attempt 2 and runs the chief there (``TF_CONFIG``'s chief
    is the attempt's lead), the spare algo-4 takes algo-2's old seat as worker 0, algo-3 stays worker 1, the chief
    resumes its checkpoint."""
    job, shared = ps_job(tmp_path, {"TRAINING_TOOLKIT_MAX_HOSTS": "3"}, H4)
    killer = HostKiller()
    killing = kill_at_epoch(killer, shared, 3, "algo-1")
    results = {r.host: r for r in run(job, tmp_path, timeout_s=420, before_start=killer.before_start)}
    killing.join(5)
    assert not killing.errors, killing.errors
    for host in ("algo-2", "algo-3", "algo-4"):  # the new lead, a worker and the spare it seated
        assert results[host].exit_code == 0, (host, results[host].failure)
    second = seen(shared, 1)
    assert sorted(second) == ["chief-0", "worker-0", "worker-1"], second
    assert [second[t]["host"] for t in ("chief-0", "worker-0", "worker-1")] == ["algo-2", "algo-4", "algo-3"], second
    for task in second.values():
        assert task["cluster"] == cluster("algo-2", ["algo-4", "algo-3"], ["algo-2", "algo-4", "algo-3"]), task
        assert task["sm_hosts"] == ["algo-2", "algo-4", "algo-3"], task
    assert second["chief-0"]["start"] >= 3  # resumed from the checkpoint the lost chief wrote
    assert finished(shared, 1)["start"] == second["chief-0"]["start"]
    out = capfd.readouterr().out
    assert "algo-2: leading the job from attempt 2 (algo-1 lost)" in out
