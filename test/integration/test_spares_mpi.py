"""Spares and a job that shrinks under MPI, end to end: real train, sshd and mpirun on local hosts, mpi4py.

The twin of test_spares.py's torch tests (``fixtures/scripts/mpi_spares.py`` is ``torch_spares.py``'s): a
host is killed whole mid-run (``helpers/deadhost.py``), and the next attempt's mpirun runs over the attempt's
active hosts only: its ``--host`` and ``-np``, each host's rank file (``SM_HOSTS``, ``SM_TRAINING_ENV``,
``SM_RESOURCE_CONFIG``, the resource config file), sshd's ``from=``.  Timed waits are generous and nothing
asserts a duration: the machine runs other work at the same time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.multihost import hps, run, source_dir
from integration.test_spares import (FAST, H3, H4, ROOM, by_host, killed_at, lead_cut_off_and_mended,
                                     lead_killed_at_the_first_barrier, seen)
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

PER_HOST = 2


def mpi_job(tmp_path: Path, hosts, env: dict, per_host: int = PER_HOST) -> tuple[LocalJob, Path]:
    src = source_dir(tmp_path, "mpi_spares.py")
    shared = tmp_path / "shared"
    shared.mkdir()
    job = LocalJob(hosts=hosts, env={**FAST, "SHARED_DIR": str(shared), **env},
                   hyperparameters=hps("mpi_spares.py", src, sagemaker_mpi_enabled=True,
                                       sagemaker_mpi_num_of_processes_per_host=per_host))
    return job, shared


def placed(info: dict[int, dict]) -> list[tuple[int, str]]:
    return sorted((rank, i["host"]) for rank, i in info.items())


def sees_hosts(info: dict[int, dict], hosts: list[str]) -> bool:
    """Every rank was given these hosts, in rank order, by every name the contract has for them."""
    return all(i["hosts"] == i["resource_hosts"] == i["file_hosts"] == i["training_env_hosts"] == hosts
               for i in info.values())


def assert_led_by_algo_2_over_three_hosts(results: dict, shared: Path) -> None:
    """algo-2, algo-3 and algo-4 ended with the job's success, and attempt 2 ran from algo-2 (mpirun, ranks 0 and 1)
    over algo-3 and algo-4, every rank told those hosts."""
    for host in ("algo-2", "algo-3", "algo-4"):
        assert results[host].exit_code == 0, (host, results[host].failure)
    second = seen(shared, 1)
    assert placed(second) == [(0, "algo-2"), (1, "algo-2"), (2, "algo-3"), (3, "algo-3"), (4, "algo-4"),
                              (5, "algo-4")], second
    assert sees_hosts(second, ["algo-2", "algo-3", "algo-4"]), second


def test_a_spare_takes_the_seat_of_a_host_killed_whole_and_every_rank_resumes(tmp_path, capfd):
    job, shared = mpi_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                         **ROOM})
    killed_at(job, tmp_path, shared, 3, "algo-2", survivors=("algo-1", "algo-3", "algo-4"))  # the spare included
    first = seen(shared, 0)  # the spare ran no rank: 3 hosts x 2
    assert placed(first) == [(0, "algo-1"), (1, "algo-1"), (2, "algo-2"), (3, "algo-2"), (4, "algo-3"),
                             (5, "algo-3")], first
    assert sees_hosts(first, list(H3)) and all(i["world"] == i["env_world"] == 6 for i in first.values()), first
    second = seen(shared, 1)  # the spare in algo-2's seat: the survivors keep their ranks, the world its size
    assert placed(second) == [(0, "algo-1"), (1, "algo-1"), (2, "algo-4"), (3, "algo-4"), (4, "algo-3"),
                              (5, "algo-3")], second
    assert sees_hosts(second, ["algo-1", "algo-4", "algo-3"]), second
    assert all(i["world"] == i["env_world"] == 6 and i["env_rank"] == r for r, i in second.items()), second
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second  # every rank resumed from the one checkpoint
    assert sorted(p.name for p in shared.glob("done-1-*")) == [f"done-1-{r}" for r in range(6)]
    assert not list(shared.glob("seen-2-*")), "one restart was enough"
    out = capfd.readouterr()
    text = out.out + out.err
    assert "algo-4: a spare: waiting (attempt 1 runs on algo-1, algo-2, algo-3)" in text
    assert "algo-4: seated in attempt 2 (rank order: algo-1, algo-4, algo-3)" in text


def test_without_a_spare_the_job_shrinks_to_the_minimum_and_completes(tmp_path):
    job, shared = mpi_job(tmp_path, H3, {"TRAINING_TOOLKIT_MIN_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                         **ROOM})
    killed_at(job, tmp_path, shared, 3, "algo-2", survivors=("algo-1", "algo-3"))
    second = seen(shared, 1)  # two hosts left: mpirun's -np 4, algo-3's ranks renumbered 2 and 3, the data resharded
    assert placed(second) == [(0, "algo-1"), (1, "algo-1"), (2, "algo-3"), (3, "algo-3")], second
    assert sees_hosts(second, ["algo-1", "algo-3"]), second
    assert all(i["world"] == i["env_world"] == 4 and i["env_rank"] == r for r, i in second.items()), second
    assert sorted(i["shard"] for i in second.values()) == [list(range(r, 12, 4)) for r in range(4)]
    assert sorted(i["shard"] for i in seen(shared, 0).values()) == [list(range(r, 12, 6)) for r in range(6)]
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second
    assert sorted(p.name for p in shared.glob("done-1-*")) == [f"done-1-{r}" for r in range(4)]


def test_the_leads_loss_fails_over_mpirun_runs_from_the_next_lead_and_the_spare_is_seated(tmp_path, capfd):
    """The lead (algo-1, where mpirun runs) killed whole: algo-2 leads attempt 2, runs mpirun there with ranks 0 and
    1 on its host, the spare takes algo-2's old seat (its sshd admitting algo-2's key now), every rank resumes."""
    job, shared = mpi_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                         **ROOM})
    killed_at(job, tmp_path, shared, 3, "algo-1", survivors=("algo-2", "algo-3", "algo-4"))  # the spare's included
    second = seen(shared, 1)
    assert placed(second) == [(0, "algo-2"), (1, "algo-2"), (2, "algo-4"), (3, "algo-4"), (4, "algo-3"),
                              (5, "algo-3")], second
    assert sees_hosts(second, ["algo-2", "algo-4", "algo-3"]), second
    assert all(i["world"] == i["env_world"] == 6 and i["env_rank"] == r for r, i in second.items()), second
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second  # resumed from the checkpoint
    assert sorted(p.name for p in shared.glob("done-1-*")) == [f"done-1-{r}" for r in range(6)]
    out = capfd.readouterr()
    text = out.out + out.err
    assert "algo-2: leading the job from attempt 2 (algo-1 lost)" in text, text[-3000:]
    assert "algo-4: following algo-2, the lead of attempt 2 (algo-1 lost)" in text, text[-3000:]


def test_the_leads_loss_without_a_spare_shrinks_under_the_next_lead(tmp_path):
    """No spare, a minimum of 2 of 4: the job goes on from algo-2 over algo-2, algo-3 and algo-4 (two workers
    besides the new lead, so that what passes between workers can fail)."""
    job, shared = mpi_job(tmp_path, H4, {"TRAINING_TOOLKIT_MIN_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                         **ROOM})
    results = killed_at(job, tmp_path, shared, 3, "algo-1")
    assert_led_by_algo_2_over_three_hosts(results, shared)
    assert sorted(p.name for p in shared.glob("done-1-*")) == [f"done-1-{r}" for r in range(6)]


def test_a_lead_cut_off_joins_the_job_as_a_spare_once_the_cut_mends_and_ends_with_its_verdict(tmp_path):
    """test_spares.py's case under MPI: the lead (mpirun's host) cut off at step 3, the others go on under algo-2
    (mpirun there, the spare in algo-1's seat); the cut mended while algo-1 looks for the job, it joins it as a
    spare (what its runner made for the job made again: a spare's sshd) and ends with the job's verdict, 0."""
    shared = lead_cut_off_and_mended(tmp_path, make_job=mpi_job)
    second = seen(shared, 1)
    assert placed(second) == [(0, "algo-2"), (1, "algo-2"), (2, "algo-4"), (3, "algo-4"), (4, "algo-3"),
                              (5, "algo-3")], second


def test_the_lead_killed_at_the_jobs_first_barrier_mpirun_runs_from_the_next_lead(tmp_path):
    """The lead killed at barrier 0 (test_spares.py's case: algo-5 cut off holds it open): the members fail over
    from the first roster, algo-2 runs mpirun over itself, algo-3 and algo-4 (its sshd started at the job's start,
    the next attempt's keys admitted on the others), ranks 0-5."""
    results, shared = lead_killed_at_the_first_barrier(tmp_path, {"TRAINING_TOOLKIT_MAX_RESTARTS": "1"},
                                                       make_job=mpi_job)
    assert_led_by_algo_2_over_three_hosts(results, shared)


def test_a_spare_killed_whole_is_said_and_mpirun_goes_on_without_a_restart(tmp_path, capfd):
    """The spare's sshd is gone, but mpirun never named it: the job completes in its first attempt."""
    job, shared = mpi_job(tmp_path, H3, {"TRAINING_TOOLKIT_MAX_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "1",
                                         **ROOM})
    killed_at(job, tmp_path, shared, 3, "algo-3", survivors=("algo-1", "algo-2"))
    assert placed(seen(shared, 0)) == [(0, "algo-1"), (1, "algo-1"), (2, "algo-2"), (3, "algo-2")]
    assert sees_hosts(seen(shared, 0), ["algo-1", "algo-2"])
    assert not list(shared.glob("seen-1-*")), "a spare's loss is no failure: no restart"
    assert sorted(p.name for p in shared.glob("done-0-*")) == [f"done-0-{r}" for r in range(4)]
    assert "algo-3, with no part in this attempt, was lost" in capfd.readouterr().out


def test_a_host_whose_ranks_fail_twice_in_a_row_is_retired_for_the_spare(tmp_path, capfd):
    """mpirun reports every failure on the first host: the failing rank's host is the cause (runners/mpi_failure.py)."""
    job, shared = mpi_job(tmp_path, H3, {"TRAINING_TOOLKIT_MAX_HOSTS": "2", "TRAINING_TOOLKIT_MAX_RESTARTS": "3",
                                         "FAIL_ON_HOST": "algo-2", **ROOM})
    results = by_host(run(job, tmp_path, timeout_s=420))
    for host in H3:  # algo-2 too: it stays joined, retired, and hears the verdict
        assert results[host].exit_code == 0, (host, results[host].failure)
    assert [placed(seen(shared, a)) for a in (0, 1, 2)] == [
        [(0, "algo-1"), (1, "algo-1"), (2, "algo-2"), (3, "algo-2")],
        [(0, "algo-1"), (1, "algo-1"), (2, "algo-2"), (3, "algo-2")],
        [(0, "algo-1"), (1, "algo-1"), (2, "algo-3"), (3, "algo-3")]]
    assert not list(shared.glob("seen-3-*")), "retired after two failures: the third attempt completes"
    assert sorted(p.name for p in shared.glob("done-2-*")) == [f"done-2-{r}" for r in range(4)]
    out = capfd.readouterr()
    text = out.out + out.err
    assert "attempt 3 of 4: algo-1, algo-3 (algo-2 retired after 2 failures; algo-3 takes its place)" in text, text
    assert "algo-1: attempt 2 of 4 starting (rank 2 on algo-2 " in text or \
        "algo-1: attempt 2 of 4 starting (rank 3 on algo-2 " in text, text


@pytest.mark.horovod
def test_horovod_a_spare_takes_the_seat_of_a_host_killed_whole(tmp_path):
    """horovod.tensorflow under mpirun: hvd.size() and hvd.rank() are the attempt's, as mpi4py's are."""
    job, shared = mpi_job(tmp_path, H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "2",
                                         "HOROVOD": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **ROOM},
                          per_host=1)
    killed_at(job, tmp_path, shared, 3, "algo-2", survivors=("algo-1", "algo-3", "algo-4"))
    assert placed(seen(shared, 0)) == [(0, "algo-1"), (1, "algo-2"), (2, "algo-3")]
    second = seen(shared, 1)
    assert placed(second) == [(0, "algo-1"), (1, "algo-4"), (2, "algo-3")], second
    assert sees_hosts(second, ["algo-1", "algo-4", "algo-3"]) and all(i["world"] == 3 for i in second.values())
    starts = {i["start"] for i in second.values()}
    assert len(starts) == 1 and starts.pop() >= 3, second
    assert sorted(p.name for p in shared.glob("done-1-*")) == ["done-1-0", "done-1-1", "done-1-2"]
