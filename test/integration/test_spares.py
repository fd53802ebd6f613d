"""Spares and a job that shrinks, end to end: real train on local hosts, torch gloo, a host killed whole.

A host is killed as a node dies (``helpers/deadhost.py``): every process in it at once, mid-run.
Timed waits are generous and nothing asserts a duration: the machine runs other work at the same time.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest

from helpers.deadhost import HostKiller, Replacement, cut, kill_when, meanwhile, wait_for
from helpers.jobrecord import STAMP_S, cost_at, metrics, of_kind, record_at, record_file, summary_lines, wall
from helpers.multihost import Tee, hps, run, source_dir
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR, EXIT_NO_MAJORITY
from training_toolkit.local.launcher import LocalJob
from training_toolkit.local.layout import host_opt_ml

H3 = ("algo-1", "algo-2", "algo-3")
H4 = (*H3, "algo-4")
H5 = (*H4, "algo-5")
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TRAINING_TOOLKIT_GRACE_PERIOD": "10"}
ROOM = {"STEPS": "30", "STEP_S": "0.3"}  # steps enough after the kill at step 3 for a loaded machine to be slow

pytestmark = [pytest.mark.root]


def torch_job(tmp_path: Path, hosts, env: dict) -> tuple[LocalJob, Path]:
    src = source_dir(tmp_path, "torch_spares.py")
    shared = tmp_path / "shared"
    shared.mkdir()
    job = LocalJob(hosts=hosts, env={**FAST, "SHARED_DIR": str(shared), **env},
                   hyperparameters=hps("torch_spares.py", src, sagemaker_torch_distributed_enabled=True,
                                       sagemaker_distributed_processes_per_host=1))
    return job, shared


def kill_at(killer: HostKiller, shared: Path, step: int, *hosts: str) -> threading.Thread:
    """Kill ``hosts`` whole once attempt 0's rank 0 has done ``step`` steps (in a thread; join it after the job)."""
    return kill_when(killer, shared / "step-0-0", step, *hosts)


def killed_at(job: LocalJob, tmp_path: Path, shared: Path, step: int, *hosts: str, survivors=(),
              killer: HostKiller | None = None) -> dict:
    """Run ``job`` with ``hosts`` killed whole at ``step`` (``kill_at``); each was killed, each of ``survivors``
    ends 0; the results by host.  ``killer``: one whose kill times the caller reads after."""
    killer = killer or HostKiller()
    killing = kill_at(killer, shared, step, *hosts)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start))
    killing.join(5)
    assert not killing.errors, killing.errors
    assert set(hosts) <= set(killer.killed), killer.killed
    for host in survivors:
        assert results[host].exit_code == 0, (host, results[host].failure)
    return results


def seen(shared: Path, attempt: int) -> dict[int, dict]:
    return {info["rank"]: info for f in shared.glob(f"seen-{attempt}-*.json") if (info := json.loads(f.read_text()))}


def by_host(results):
    return {r.host: r for r in results}


def run_with_faults(job: LocalJob, tmp_path: Path, killer: HostKiller, faults, survivors, out: Tee,
                    timeout_s: float = 420) -> dict:
    """Run ``job`` while ``faults`` act on it (``meanwhile``); each of ``survivors`` ends 0; the results by host."""
    faulting = meanwhile(faults)
    results = by_host(run(job, tmp_path, timeout_s=timeout_s, before_start=killer.before_start, out=out))
    faulting.join(5)
    assert not faulting.errors, faulting.errors
    for host in survivors:
        assert results[host].exit_code == 0, (host, results[host].failure)
    return results


def assert_led(shared: Path, attempt: int, lead: str, hosts: set[str]) -> None:
    """``attempt``'s rank 0 ran on ``lead``, and its ranks on ``hosts``."""
    ranks = seen(shared, attempt)
    assert ranks[0]["host"] == lead and {i["host"] for i in ranks.values()} == hosts, ranks


@pytest.mark.torch
def test_a_spare_takes_the_seat_of_a_host_killed_whole_and_every_rank_resumes(tmp_path):
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                           **ROOM})
    killer = HostKiller()  # every surviving host, the spare included, succeeds
    results = killed_at(job, tmp_path, shared, 3, "algo-2", survivors=("algo-1", "algo-3", "algo-4"), killer=killer)
    first = seen(shared, 0)
    assert sorted((i["rank"], i["host"]) for i in first.values()) == [(0, "algo-1"), (1, "algo-2"), (2, "algo-3")]
    assert all(i["hosts"] == list(H3) and i["world"] == 3 for i in first.values()), first
    second = seen(shared, 1)  # the spare in algo-2's seat: the survivors keep their ranks, the world its size
    assert sorted((i["rank"], i["host"]) for i in second.values()) == [(0, "algo-1"), (1, "algo-4"), (2, "algo-3")]
    assert all(i["world"] == i["env_world"] == 3 and i["hosts"] == ["algo-1", "algo-4", "algo-3"]
               for i in second.values()), second
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second  # every rank resumed from the one checkpoint
    assert sorted(p.name for p in shared.glob("done-1-*")) == ["done-1-0", "done-1-1", "done-1-2"]
    assert not list(shared.glob("seen-2-*")), "one restart was enough"
    # the lead's record: algo-2's loss, seen after its kill; the spare seated in the next attempt
    entries = record_at(results["algo-1"].opt_ml, "algo-1")
    lost = of_kind(entries, "fault")[0]
    killed = wall(killer.killed["algo-2"])
    assert (lost["attempt"], lost["fault"], lost["host"]) == (0, "host_lost", "algo-2") and \
        killed - 1 < lost["t"] < killed + 15, (killed, entries)
    assert [(i["active"], i["spares"]) for i in of_kind(entries, "attempt")] == [
        (["algo-1", "algo-2", "algo-3"], ["algo-4"]), (["algo-1", "algo-4", "algo-3"], [])]
    # progress and rank 0's checkpoint marks are watched with no stall timeout set: the cost counts the work lost
    assert {item["attempt"] for item in of_kind(entries, "checkpoint")} == {0, 1}, entries
    cost = cost_at(results["algo-1"].opt_ml, "algo-1")
    assert cost["basis"] == "progress" and cost["lost_work_included"] is True and cost["goodput"] is not None, cost
    assert 0 <= cost["faults"][0]["lost_work_s"] < 3 * float(ROOM["STEP_S"]) + 2, cost  # a step or so since the mark
    # the picture of the job, from every host's record under local's work directory: every host, the fault
    from training_toolkit.record import timeline

    picture = timeline.layout(timeline.find_records(tmp_path / "cluster"))
    assert picture.hosts == H4 and [(m.fault, m.host) for m in picture.marks] == [("host_lost", "algo-2")]
    assert {(s.host, s.role) for s in picture.segments if s.attempt == 1} == {
        ("algo-1", "lead"), ("algo-4", "active"), ("algo-3", "active"), ("algo-2", "lost")}
    if importlib.util.find_spec("matplotlib"):
        svg = tmp_path / "job.svg"
        timeline.draw(picture, svg)
        assert all(host in svg.read_text() for host in H4) and "host_lost: algo-2 lost" in svg.read_text()


@pytest.mark.torch
def test_without_a_spare_the_job_shrinks_to_the_minimum_and_completes(tmp_path):
    job, shared = torch_job(tmp_path, H3, {"TRAINING_TOOLKIT_MIN_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                           **ROOM})
    killed_at(job, tmp_path, shared, 3, "algo-2", survivors=("algo-1", "algo-3"))
    second = seen(shared, 1)  # two hosts left: the world shrinks, algo-3 renumbered rank 1, the data resharded
    assert sorted((i["rank"], i["host"]) for i in second.values()) == [(0, "algo-1"), (1, "algo-3")]
    assert all(i["world"] == i["env_world"] == 2 and i["hosts"] == ["algo-1", "algo-3"] for i in second.values())
    assert sorted(i["shard"] for i in second.values()) == [list(range(0, 12, 2)), list(range(1, 12, 2))]
    assert sorted(i["shard"] for i in seen(shared, 0).values()) == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second
    assert sorted(p.name for p in shared.glob("done-1-*")) == ["done-1-0", "done-1-1"]


@pytest.mark.torch
def test_below_the_minimum_the_job_ends_naming_the_lost_hosts_and_the_minimum(tmp_path):
    """Two of five hosts killed with a minimum of 4: the lead keeps a majority (3 of 5), so the shortfall is the
    job's verdict, named.  (The lead left alone, 1 of 3, would say no majority instead, 203: it may be the one
    cut off, and the others a majority going on without it.)"""
    job, shared = torch_job(tmp_path, H5, {"TRAINING_TOOLKIT_MIN_HOSTS": "4", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                           "STEPS": "200"})
    results = killed_at(job, tmp_path, shared, 2, "algo-4", "algo-5")
    for host in ("algo-1", "algo-2", "algo-3"):  # the lead's verdict, the job's
        result = results[host]
        assert result.exit_code == EXIT_CLUSTER_ERROR, (host, result.failure)
        assert "algo-4" in result.failure and "algo-5" in result.failure and "minimum of 4" in result.failure, \
            (host, result.failure)
    assert not list(shared.glob("done-*"))


@pytest.mark.tensorflow
def test_multi_worker_mirrored_a_spare_takes_the_seat_of_a_worker_host_killed_whole(tmp_path):
    src = source_dir(tmp_path, "mwms_spares.py")
    shared = tmp_path / "shared"
    shared.mkdir()
    # a worker waiting in the strategy's set-up outlives SIGTERM: a short grace keeps the test short
    job = LocalJob(hosts=H3, env={**FAST, "SHARED_DIR": str(shared), "TF_CPP_MIN_LOG_LEVEL": "2",
                                  "TRAINING_TOOLKIT_GRACE_PERIOD": "5", "TRAINING_TOOLKIT_MAX_HOSTS": "2",
                                  "TRAINING_TOOLKIT_MAX_RESTARTS": "1"},
                   hyperparameters=hps("mwms_spares.py", src, sagemaker_multi_worker_mirrored_strategy_enabled=True))
    killer = HostKiller()

    def kill_the_doomed() -> None:
        wait_for(shared / "doomed", timeout_s=240)
        killer.kill((shared / "doomed").read_text())

    killing = meanwhile(kill_the_doomed)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start))
    killing.join(5)
    assert not killing.errors, killing.errors
    assert list(killer.killed) == ["algo-2"]
    for host in ("algo-1", "algo-3"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    workers = {i: json.loads((shared / f"worker-1-{i}.json").read_text()) for i in (0, 1)}
    assert [workers[i]["host"] for i in (0, 1)] == ["algo-1", "algo-3"]  # the spare in algo-2's seat, index 1
    assert all(len(w["workers"]) == 2 and w["sm_hosts"] == ["algo-1", "algo-3"] for w in workers.values())
    assert workers[0]["w"] == workers[1]["w"]


@pytest.mark.tensorflow
def test_multi_worker_mirrored_worker_0s_host_killed_whole_fails_over_worker_0_to_the_next_lead(tmp_path):
    """Worker 0 runs on the lead: killed whole, algo-2 leads attempt 2 as worker 0, the spare takes algo-2's old seat
    as worker 1, algo-3 stays worker 2."""
    src = source_dir(tmp_path, "mwms_spares.py")
    shared = tmp_path / "shared"
    shared.mkdir()
    job = LocalJob(hosts=H4, env={**FAST, "SHARED_DIR": str(shared), "TF_CPP_MIN_LOG_LEVEL": "2", "DOOMED_INDEX": "0",
                                  "TRAINING_TOOLKIT_GRACE_PERIOD": "5", "TRAINING_TOOLKIT_MAX_HOSTS": "3",
                                  "TRAINING_TOOLKIT_MAX_RESTARTS": "1"},
                   hyperparameters=hps("mwms_spares.py", src, sagemaker_multi_worker_mirrored_strategy_enabled=True))
    killer = HostKiller()
    killing = kill_when(killer, shared / "doomed", None, "algo-1")
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start))
    killing.join(5)
    assert not killing.errors, killing.errors
    for host in ("algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    workers = {i: json.loads((shared / f"worker-1-{i}.json").read_text()) for i in (0, 1, 2)}
    order = ["algo-2", "algo-4", "algo-3"]
    assert [workers[i]["host"] for i in (0, 1, 2)] == order, workers
    assert all([w.split(":")[0] for w in worker["workers"]] == order for worker in workers.values()), workers
    assert all(w["sm_hosts"] == order for w in workers.values()), workers
    assert workers[0]["w"] == workers[1]["w"] == workers[2]["w"], workers


@pytest.mark.torch
def test_the_leads_loss_fails_over_to_the_next_host_and_the_spare_is_seated(tmp_path, capfd):
    """The lead (algo-1) killed whole: algo-2, the first member left in the platform's order, leads attempt 2 with
    rank 0 and MASTER_ADDR there; the spare takes algo-2's old seat and algo-3 keeps its own; every rank resumes from
    the one checkpoint."""
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                           **ROOM})
    killer = HostKiller()  # the new lead, a worker and the spare it seated end with the job's verdict
    results = killed_at(job, tmp_path, shared, 3, "algo-1", survivors=("algo-2", "algo-3", "algo-4"), killer=killer)
    second = seen(shared, 1)
    assert sorted((i["rank"], i["host"]) for i in second.values()) == [(0, "algo-2"), (1, "algo-4"), (2, "algo-3")], \
        second
    assert all(i["hosts"] == ["algo-2", "algo-4", "algo-3"] and i["world"] == 3 for i in second.values()), second
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second  # resumed from the checkpoint, not from the start
    assert sorted(p.name for p in shared.glob("done-1-*")) == ["done-1-0", "done-1-1", "done-1-2"]
    out = capfd.readouterr()
    text = out.out + out.err
    assert "algo-2: leading the job from attempt 2 (algo-1 lost)" in text, text[-3000:]
    assert "algo-3: following algo-2, the lead of attempt 2 (algo-1 lost)" in text, text[-3000:]
    # the new lead's record: the lead's loss when it was seen (after the kill, within the peer timeout and its
    # margin), the failover, each attempt with its lead; the one summary line on both hosts' logs
    entries = record_at(results["algo-2"].opt_ml, "algo-2")
    seats = [(i["attempt"], i["lead"], i["active"], i["spares"]) for i in of_kind(entries, "attempt")]
    assert seats == [(0, "algo-1", ["algo-1", "algo-2", "algo-3"], ["algo-4"]),
                     (1, "algo-2", ["algo-2", "algo-4", "algo-3"], [])], seats
    lost = of_kind(entries, "fault")[0]
    killed = wall(killer.killed["algo-1"])
    assert (lost["attempt"], lost["fault"], lost["host"]) == (0, "host_lost", "algo-1"), entries
    assert killed - 1 < lost["t"] < killed + 15, (killed, lost)
    assert [(i["attempt"], i["lost"]) for i in of_kind(entries, "restart")] == [(1, "algo-1")]
    # rank 0 marked its checkpoints on algo-1, the lost lead, which told every host: the new lead's record has them
    marks = [i for i in of_kind(entries, "checkpoint") if i["attempt"] == 0]
    assert marks and {i["host"] for i in marks} == {"algo-1"} and max(i["t"] for i in marks) < killed + STAMP_S, entries
    cost = cost_at(results["algo-2"].opt_ml, "algo-2")
    assert cost["faults"][0]["next_attempt"] == 1 and 0 < cost["faults"][0]["lost_s"] < 60, cost
    lines = summary_lines(text)
    assert len(lines) == 3 and len(set(lines)) == 1, lines  # the new lead's, the worker's, the spare's: the lead's
    assert metrics(lines[0])["toolkit:attempts"] == "2", lines


@pytest.mark.torch
def test_the_lead_killed_during_a_restarts_barrier_fails_over_for_that_restart(tmp_path, capfd):
    """Rank 0 fails, the lead calls a restart and waits at its barrier for algo-3 (whose rank takes the grace to
    stop); algo-2 and the spare wait for the go.  The lead killed then: they meet algo-2 for that same restart."""
    hold = tmp_path / "release"
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "1",
                                           "STEPS": "6", "STEP_S": "0.3", "HOLD_FILE": str(hold), "HOLD_ATTEMPT": "0",
                                           "HOLD_EXIT": "1", "TERM_MARK": "1", "IGNORE_TERM_ON_HOST": "algo-3",
                                           "LINGER_S": "120"})
    killer = HostKiller()

    def fail_then_kill_the_lead() -> None:
        wait_for(shared / "done-0-1")  # algo-2's rank finished its steps: rank 0 holds
        hold.write_text("")  # rank 0 exits 1: the lead calls the restart and stops its part
        wait_for(shared / "term-0-1")  # algo-2's rank was stopped: algo-2 goes to the barrier
        time.sleep(1.0)  # algo-3's rank ignores SIGTERM: the lead waits for it at the barrier
        killer.kill("algo-1")

    killing = meanwhile(fail_then_kill_the_lead)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start))
    killing.join(5)
    assert not killing.errors, killing.errors
    for host in ("algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    second = seen(shared, 1)  # the one restart MAX_RESTARTS allows, led by algo-2
    assert sorted((i["rank"], i["host"]) for i in second.values()) == [(0, "algo-2"), (1, "algo-4"), (2, "algo-3")]
    assert not list(shared.glob("seen-2-*"))
    out = capfd.readouterr()
    text = out.out + out.err
    # algo-2 heard the restart (its line), then lost the lead at the barrier and led that same attempt
    said = text.index("algo-2: attempt 2 of 2 starting")
    assert text.index("algo-2: leading the job from attempt 2 (algo-1 lost)") > said, text[-3000:]
    assert "algo-4: following algo-2, the lead of attempt 2 (algo-1 lost)" in text, text[-3000:]


def lead_killed_at_the_first_barrier(tmp_path: Path, env: dict, out=None, make_job=None) -> tuple[dict, Path]:
    """A job of 5 hosts (``make_job``'s, like ``torch_job``: the default) whose algo-5 is cut off from the start, so the
    lead holds the job's first barrier open for it; algo-1 killed once algo-2, algo-3 and algo-4 joined it (each
    record's first entry), before its go: the results by host, and the job's shared directory."""
    job, shared = (make_job or torch_job)(tmp_path, H5, {"TRAINING_TOOLKIT_MAX_HOSTS": "4",
                                                         "TRAINING_TOOLKIT_MIN_HOSTS": "3", **env, **ROOM})
    killer = HostKiller()

    def cut_algo_5_from_the_start(cluster) -> None:
        killer.before_start(cluster)
        cut(cluster, "algo-5")

    def kill_the_lead_once_the_others_joined() -> None:
        for host in ("algo-2", "algo-3", "algo-4"):  # each joined the lead: its record's first entry is made
            wait_for(record_file(host_opt_ml(tmp_path / "cluster", host), host))
        killer.kill("algo-1")

    faulting = meanwhile(kill_the_lead_once_the_others_joined)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=cut_algo_5_from_the_start,
                          **({"out": out} if out is not None else {})))
    faulting.join(5)
    assert not faulting.errors, faulting.errors
    assert not list(shared.glob("seen-0-*"))  # the lost lead's go reached no one
    return results, shared


@pytest.mark.torch
def test_the_lead_killed_at_the_jobs_first_barrier_the_members_fail_over_and_the_job_completes(tmp_path, capfd):
    """The members fail over from the attempt the lost lead would have started (the first roster): algo-2 leads
    attempt 2 with 3 of the 5 members behind it, the job shrinks to the minimum and completes."""
    results, shared = lead_killed_at_the_first_barrier(tmp_path, {"TRAINING_TOOLKIT_MAX_RESTARTS": "1"})
    for host in ("algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    assert_led(shared, 1, "algo-2", {"algo-2", "algo-3", "algo-4"})
    text = capfd.readouterr().out
    for host in ("algo-2", "algo-3", "algo-4"):
        assert (f"{host}: algo-1 was lost before attempt 1 started here (its go may have reached others): the "
                f"members fail over to attempt 2") in text, text[-3000:]
    assert "algo-2: leading the job from attempt 2 (algo-1 lost)" in text, text[-3000:]
    assert "algo-3: following algo-2, the lead of attempt 2 (algo-1 lost)" in text, text[-3000:]
    assert "algo-2: attempt 2 of 2 starting (the lead was lost before the job started)" in text, text[-3000:]
    # what it cost, in the new lead's record: the attempt algo-1 would have started, never started, its loss the fault
    entries = record_at(results["algo-2"].opt_ml, "algo-2")
    assert [(i["attempt"], i["lead"]) for i in of_kind(entries, "attempt")] == [(0, "algo-1"), (1, "algo-2")], entries
    assert [(i["attempt"], i["lost"]) for i in of_kind(entries, "restart")] == [(1, "algo-1")], entries
    (fault,) = cost_at(results["algo-2"].opt_ml, "algo-2")["faults"]
    assert (fault["attempt"], fault["fault"], fault["host"], fault["next_attempt"]) == (0, "host_lost", "algo-1", 1)
    assert 0 < fault["lost_s"] < 120, fault


@pytest.mark.torch
def test_the_lead_killed_at_the_jobs_first_barrier_without_a_restart_left_ends_the_job_named(tmp_path):
    """The same with no restart allowed: the failover would be one (hosts its go reached count it so), so every
    member ends, naming why."""
    results, shared = lead_killed_at_the_first_barrier(tmp_path, {})
    for host in ("algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == EXIT_CLUSTER_ERROR, (host, results[host].exit_code, results[host].failure)
        assert "no restart left to lead the job on after algo-1 was lost" in results[host].failure, results[host].failure
    assert not list(shared.glob("seen-*"))


@pytest.mark.torch
def test_the_lead_then_the_new_lead_killed_in_one_job_each_time_the_next_member_leads(tmp_path):
    """algo-1, then algo-2 (the lead after it): each attempt's members are the base for the next."""
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "3",
                                           **ROOM})
    killer = HostKiller()
    first = kill_at(killer, shared, 3, "algo-1")
    second = kill_when(killer, shared / "step-1-0", 6, "algo-2")
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start))
    first.join(5)
    second.join(5)
    assert not first.errors and not second.errors, (first.errors, second.errors)
    for host in ("algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    assert sorted((i["rank"], i["host"]) for i in seen(shared, 1).values()) == [(0, "algo-2"), (1, "algo-3")]
    third = seen(shared, 2)
    assert sorted((i["rank"], i["host"]) for i in third.values()) == [(0, "algo-3"), (1, "algo-4")], third
    assert {i["start"] for i in third.values()} == {max(i["start"] for i in third.values())} and \
        third[0]["start"] >= 6, third  # resumed from the checkpoint the second lead wrote
    assert sorted(p.name for p in shared.glob("done-2-*")) == ["done-2-0", "done-2-1"]


@pytest.mark.torch
def test_the_new_lead_killed_during_its_first_barrier_the_member_after_it_leads_the_attempt_after_it(tmp_path, capfd):
    """algo-1 killed; algo-2 leads attempt 2 and waits at its barrier for algo-4, whose rank takes the grace to stop,
    with algo-3 and the spare algo-5 joined; algo-2 killed then: algo-3 and algo-5 pass it over and algo-3 leads
    the attempt after algo-2's (3 of the 5 members; algo-2's go might have reached some hosts: ``succession.term``),
    and algo-4, which tries algo-2 first, is given the wait that takes and asks algo-3 for the same attempt."""
    job, shared = torch_job(tmp_path, H5, {"TRAINING_TOOLKIT_MAX_HOSTS": "4", "TRAINING_TOOLKIT_MIN_HOSTS": "3",
                                           "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                           "IGNORE_TERM_ON_HOST": "algo-4",
                                           **ROOM})
    killer, out = HostKiller(), Tee()

    def kill_the_lead_then_the_next_in_its_barrier() -> None:
        wait_for(shared / "step-0-0", at_least=3)
        killer.kill("algo-1")
        out.wait_for("algo-3: following algo-2, the lead of attempt 2", "algo-5: following algo-2, the lead of attempt 2")
        killer.kill("algo-2")

    run_with_faults(job, tmp_path, killer, kill_the_lead_then_the_next_in_its_barrier, ("algo-3", "algo-4", "algo-5"),
                    out)
    assert_led(shared, 2, "algo-3", {"algo-3", "algo-4", "algo-5"})  # attempt 3; 2 was algo-2's, its go sent to no one
    assert not list(shared.glob("seen-1-*")) and not list(shared.glob("seen-3-*"))
    text = capfd.readouterr().out
    for host in ("algo-3", "algo-5"):
        assert (f"{host}: algo-2 was lost too, before attempt 2 started here (its go may have reached others): the next "
                f"member leads the attempt after it") in text, text[-3000:]
    assert "algo-3: leading the job from attempt 3 (algo-1, algo-2 lost)" in text, text[-3000:]
    assert "algo-5: following algo-3, the lead of attempt 3 (algo-1, algo-2 lost)" in text, text[-3000:]
    assert "algo-4: following algo-3, the lead of attempt 3 (algo-1 lost)" in text, text[-3000:]


@pytest.mark.torch
def test_the_new_lead_lost_after_its_go_reached_some_members_every_survivor_meets_the_next_lead_at_one_attempt(
        tmp_path, capfd):
    """algo-1 killed while algo-4's link is cut: algo-2 leads attempt 2 without algo-4 (3 of the 5 members at its
    deadline), which algo-3 and algo-5 start; then algo-2 killed, and algo-4, which never had that go, mended.  algo-3
    and algo-5 fail over from attempt 2, algo-4 passes algo-2 over: all three meet algo-3 at attempt 3, algo-4 seated
    (before ``succession.term``, algo-4 asked algo-3 for attempt 2, and was not seated: the job fell below its
    minimum)."""
    job, shared = torch_job(tmp_path, H5, {"TRAINING_TOOLKIT_MAX_HOSTS": "4", "TRAINING_TOOLKIT_MIN_HOSTS": "3",
                                           "TRAINING_TOOLKIT_MAX_RESTARTS": "3", **ROOM})
    killer, out = HostKiller(), Tee()

    def faults() -> None:
        wait_for(shared / "step-0-0", at_least=3)
        assert killer.cluster is not None
        cut(killer.cluster, "algo-4")
        killer.kill("algo-1")
        wait_for(shared / "step-1-0", at_least=2, timeout_s=180)  # algo-2's attempt runs, without algo-4
        killer.kill("algo-2")
        cut(killer.cluster, "algo-4", mend=True)

    run_with_faults(job, tmp_path, killer, faults, ("algo-3", "algo-4", "algo-5"), out, timeout_s=480)
    assert_led(shared, 1, "algo-2", {"algo-2", "algo-3", "algo-5"})
    assert_led(shared, 2, "algo-3", {"algo-3", "algo-4", "algo-5"})  # algo-4 seated: it asked for the others' attempt
    text = capfd.readouterr().out
    assert "algo-3: leading the job from attempt 3 (algo-2 lost)" in text, text[-3000:]
    assert "algo-4: following algo-3, the lead of attempt 3 (algo-1 lost)" in text, text[-3000:]


@pytest.mark.torch
def test_a_lead_cut_off_from_the_others_stops_while_they_go_on_under_a_new_lead(tmp_path, capfd):
    """The lead's link cut, not the lead killed, with a minimum of one host (it could shrink to itself): it has no
    majority behind it, so it stops its ranks and ends, named, and runs no attempt beside the others' new one.  The cut
    never mends: it looks for the job under another lead for its rejoin wait, finds none, and leaves with 203."""
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MIN_HOSTS": "1",
                                           "TRAINING_TOOLKIT_MAX_RESTARTS": "2", "TRAINING_TOOLKIT_REJOIN_WAIT": "3",
                                           **ROOM})
    killer = HostKiller()
    cutting = kill_when(killer, shared / "step-0-0", 3, "algo-1", cut_only=True)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start))
    cutting.join(5)
    assert not cutting.errors, cutting.errors
    for host in ("algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    assert results["algo-1"].exit_code == EXIT_NO_MAJORITY, results["algo-1"].failure
    assert "no majority to lead the job" in results["algo-1"].failure, results["algo-1"].failure
    later = [info for attempt in (1, 2, 3) for info in seen(shared, attempt).values()]
    assert later and all(info["host"] != "algo-1" for info in later), later  # no attempt of its own after the cut
    assert sorted((i["rank"], i["host"]) for i in seen(shared, 1).values()) == [
        (0, "algo-2"), (1, "algo-4"), (2, "algo-3")], seen(shared, 1)
    text = capfd.readouterr().out
    assert "algo-1: no host leads the job after 3 s of looking: leaving with 203" in text, text[-3000:]


def lead_cut_off_and_mended(tmp_path: Path, make_job=None) -> Path:
    """A job of 4 hosts (``make_job``'s, like ``torch_job``: the default) and one spare, a minimum of one host: the
    lead's link cut at step 3, and mended once the others run their attempt under algo-2 and algo-1 looks for the
    job under another lead.  Every host ends 0; algo-1 ran no attempt after the cut, left the job with 203 and
    joined the others' as a spare.  The job's shared directory."""
    job, shared = (make_job or torch_job)(tmp_path, H4, {
        "TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MIN_HOSTS": "1", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
        "TRAINING_TOOLKIT_REJOIN_WAIT": "120", "STEPS": "100", "STEP_S": "0.3"})  # the others' attempt outlasts the look
    killer, out = HostKiller(), Tee()

    def faults() -> None:
        wait_for(shared / "step-0-0", at_least=3)
        assert killer.cluster is not None
        cut(killer.cluster, "algo-1")
        wait_for(shared / "step-1-0", at_least=2, timeout_s=180)  # algo-2's attempt runs, without algo-1
        out.wait_for("algo-1: looking for the job under another lead", timeout_s=180)
        cut(killer.cluster, "algo-1", mend=True)

    run_with_faults(job, tmp_path, killer, faults, H4, out, timeout_s=480)
    later = [info for attempt in (1, 2, 3) for info in seen(shared, attempt).values()]
    assert all(info["host"] != "algo-1" for info in later), later  # no attempt of its own after the cut
    mine = "\n".join(line for line in out.text().splitlines() if line.startswith("[algo-1]"))
    assert "it left the job with 203: algo-1: no majority to lead the job" in mine, mine
    assert "algo-1: the job runs without this host (attempt 2, under another lead): joining it as a spare" in mine, mine
    return shared


@pytest.mark.torch
def test_a_lead_cut_off_joins_the_job_as_a_spare_once_the_cut_mends_and_ends_with_its_verdict(tmp_path):
    """As above, the cut mended once the others run their attempt under algo-2 and algo-1 is out of the job: it looks
    for the job under another lead (``TRAINING_TOOLKIT_REJOIN_WAIT``), finds algo-2's, joins it as a spare and ends
    with the job's verdict, 0, not its own 203.  It runs no attempt of its own."""
    shared = lead_cut_off_and_mended(tmp_path)
    assert_led(shared, 1, "algo-2", {"algo-2", "algo-3", "algo-4"})


@pytest.mark.torch
def test_the_leads_loss_with_two_members_ends_the_job_named_no_majority_without_it(tmp_path):
    """Two hosts and no spare: the survivor alone is no majority (it cannot tell a dead lead from a cut cable)."""
    job, shared = torch_job(tmp_path, ("algo-1", "algo-2"), {"TRAINING_TOOLKIT_MIN_HOSTS": "1",
                                                             "TRAINING_TOOLKIT_MAX_RESTARTS": "2", "STEPS": "200"})
    results = killed_at(job, tmp_path, shared, 2, "algo-1")
    assert results["algo-2"].exit_code == EXIT_CLUSTER_ERROR, results["algo-2"].failure
    assert "lost the lead algo-1" in results["algo-2"].failure, results["algo-2"].failure


@pytest.mark.torch
def test_a_host_whose_ranks_fail_twice_in_a_row_is_retired_for_the_spare(tmp_path):
    job, shared = torch_job(tmp_path, H3, {"TRAINING_TOOLKIT_MAX_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "3",
                                           "FAIL_ON_HOST": "algo-2", **ROOM})
    results = by_host(run(job, tmp_path, timeout_s=420))
    for host in H3:  # algo-2 too: it stays joined, retired, and hears the verdict
        assert results[host].exit_code == 0, (host, results[host].failure)
    assert [seen(shared, a)[1]["host"] for a in (0, 1, 2)] == ["algo-2", "algo-2", "algo-3"]
    assert not list(shared.glob("seen-3-*")), "retired after two failures: the third attempt completes"
    assert sorted(p.name for p in shared.glob("done-2-*")) == ["done-2-0", "done-2-1"]


@pytest.mark.torch
def test_a_spare_killed_whole_is_said_and_the_job_goes_on_without_a_restart(tmp_path, capfd):
    job, shared = torch_job(tmp_path, H3, {"TRAINING_TOOLKIT_MAX_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "1",
                                           **ROOM})
    killed_at(job, tmp_path, shared, 3, "algo-3", survivors=("algo-1", "algo-2"))
    assert not list(shared.glob("seen-1-*")), "a spare's loss is no failure: no restart"
    assert "algo-3, with no part in this attempt, was lost" in capfd.readouterr().out


@pytest.mark.torch
def test_a_host_back_from_its_loss_waits_as_a_spare_past_the_join_deadline_and_takes_the_next_lost_seat(tmp_path):
    """A platform's replacement (the killed host's train started again in it) joins while an attempt runs; no
    restart comes for longer than the join deadline plus the grace, and the next loss seats it.  It used to give up
    at that deadline, and the job, with no spare left and MIN = MAX, ended on the second loss (found by
    bench/goodput.py)."""
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "3",
                                           "TRAINING_TOOLKIT_JOIN_TIMEOUT": "20", "TRAINING_TOOLKIT_GRACE_PERIOD": "5",
                                           "STEPS": "250", "STEP_S": "0.3"})
    killer = HostKiller()
    replacement = Replacement("algo-2")  # the killed host's train started again, in the same host, 1 s after

    def faults() -> None:
        wait_for(shared / "step-0-0", timeout_s=240, at_least=3)
        killer.kill("algo-2")  # algo-4, the spare, takes its seat; algo-2 comes back and waits
        wait_for(shared / "step-1-0", timeout_s=240, at_least=1)
        replacement.wait_back("algo-2", 20 + 5 + 5 + 10)  # past the join deadline, the grace and a joiner's margin
        killer.kill("algo-3")

    killing = meanwhile(faults)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start, restart=replacement))
    killing.join(5)
    assert not killing.errors, killing.errors
    for host in ("algo-1", "algo-2", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    assert sorted((i["rank"], i["host"]) for i in seen(shared, 1).values()) == [(0, "algo-1"), (1, "algo-4"),
                                                                                (2, "algo-3")]
    third = seen(shared, 2)  # algo-2, back and waiting for longer than the join deadline, in algo-3's seat
    assert sorted((i["rank"], i["host"]) for i in third.values()) == [(0, "algo-1"), (1, "algo-4"), (2, "algo-2")]
    assert sorted(p.name for p in shared.glob("done-2-*")) == ["done-2-0", "done-2-1", "done-2-2"]


@pytest.mark.torch
def test_a_host_back_and_waiting_when_the_lead_is_lost_follows_the_next_lead_which_seats_it(tmp_path):
    """algo-3 killed (the spare takes its seat) and back as a spare; then the lead killed: algo-3, waiting for its
    first seat, follows algo-2, the next lead, whose first barrier waits for the hosts the job needs (3) and seats it.
    It used to end with "lost the lead" and the job with it, one host short (found by bench/goodput.py, schedule c)."""
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "3",
                                           "TRAINING_TOOLKIT_GRACE_PERIOD": "5", "STEPS": "250", "STEP_S": "0.3"})
    killer = HostKiller()
    replacement = Replacement("algo-3")

    def faults() -> None:
        wait_for(shared / "step-0-0", timeout_s=240, at_least=3)
        killer.kill("algo-3")  # algo-4, the spare, takes its seat; algo-3 comes back and waits
        wait_for(shared / "step-1-0", timeout_s=240, at_least=4)
        replacement.wait_back("algo-3", 10)  # algo-3's train has joined and waits for its seat
        killer.kill("algo-1")

    killing = meanwhile(faults)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start, restart=replacement))
    killing.join(5)
    assert not killing.errors, killing.errors
    for host in ("algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    third = seen(shared, 2)  # under algo-2, algo-3 seated in the lost lead's place
    assert sorted(i["host"] for i in third.values()) == ["algo-2", "algo-3", "algo-4"], third
    assert next(i["host"] for i in third.values() if i["rank"] == 0) == "algo-2"
    assert sorted(p.name for p in shared.glob("done-2-*")) == ["done-2-0", "done-2-1", "done-2-2"]


@pytest.mark.torch
def test_the_lost_first_host_back_joins_the_running_job_as_a_spare_not_a_second_job(tmp_path, capfd):
    """algo-1, the platform's first host, killed and its train started again (a pod made again): the job runs under
    algo-2 by then, so algo-1 follows it as a spare (no second channel, no second job), and the next loss seats it."""
    job, shared = torch_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "3",
                                           "TRAINING_TOOLKIT_GRACE_PERIOD": "5", "STEPS": "250", "STEP_S": "0.3"})
    killer = HostKiller()

    def as_a_pod_made_again(name: str) -> None:  # the platform's hosts, algo-1 first, not the last attempt's order
        config = tmp_path / "cluster" / name / "opt" / "ml" / "input" / "config" / "resourceconfig.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "hosts": list(H4)}))

    replacement = Replacement("algo-1", "algo-3", as_made_again=as_a_pod_made_again)

    def faults() -> None:
        wait_for(shared / "step-0-0", timeout_s=240, at_least=3)
        killer.kill("algo-1")  # algo-2 leads, algo-4 takes its seat; algo-1 comes back and waits
        wait_for(shared / "step-1-0", timeout_s=240, at_least=4)
        replacement.wait_back("algo-1", 10)
        killer.kill("algo-3")

    killing = meanwhile(faults)
    results = by_host(run(job, tmp_path, timeout_s=420, before_start=killer.before_start, restart=replacement))
    killing.join(5)
    assert not killing.errors, killing.errors
    # algo-1's second train too, and algo-3's, which found its first host no lead and the job under algo-2
    for host in ("algo-1", "algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    assert sorted((i["rank"], i["host"]) for i in seen(shared, 1).values()) == [(0, "algo-2"), (1, "algo-4"),
                                                                                (2, "algo-3")]
    third = seen(shared, 2)  # algo-1, back as a spare, in algo-3's seat
    assert sorted((i["rank"], i["host"]) for i in third.values()) == [(0, "algo-2"), (1, "algo-4"), (2, "algo-1")]
    out = capfd.readouterr()
    text = out.out + out.err
    assert "algo-1: the job runs without this host (attempt 2, under another lead): joining it as a spare" in text
    assert "algo-3: algo-1 does not answer; the job runs under algo-2: joining it" in text
