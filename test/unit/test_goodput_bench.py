"""The goodput benchmark's pure parts (bench/goodput_plan.py): the seeded schedule, the victim, the arithmetic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import goodput_plan as plan  # noqa: E402


def test_the_full_schedule_kills_every_20_s_give_or_take_2_for_120_s_and_each_host_is_back_15_s_later():
    faults = plan.schedule(seed=1)
    assert len(faults) == 6
    for index, fault in enumerate(faults, start=1):
        assert 20 * index - 2 <= fault.at_s <= 20 * index + 2
        assert fault.back_s == pytest.approx(fault.at_s + 15, abs=0.002)
        assert 0 <= fault.pick < 1
    gaps = [b.at_s - a.at_s for a, b in zip(faults, faults[1:])]
    assert all(gap > 15 for gap in gaps), gaps  # each host is back before the next kill


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert plan.schedule(7) == plan.schedule(7)
    assert plan.schedule(7) != plan.schedule(8)


def test_scale_multiplies_every_time_and_keeps_the_picks():
    full, half = plan.schedule(3), plan.schedule(3, scale=0.5)
    assert [f.pick for f in half] == [f.pick for f in full]
    assert [f.at_s for f in half] == pytest.approx([f.at_s / 2 for f in full], abs=0.002)
    assert [f.back_s for f in half] == pytest.approx([f.back_s / 2 for f in full], abs=0.002)


@pytest.mark.parametrize("kwargs, message", [
    ({"scale": 0}, "scale must be above 0"),
    ({"back_after_s": 17}, "must be back"),
])
def test_a_schedule_that_cannot_be_kept_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan.schedule(1, **kwargs)


@pytest.mark.parametrize("pick, running, up, expected", [
    (0.0, ["algo-1", "algo-3", "algo-2"], ["algo-1", "algo-2", "algo-3", "algo-4"], "algo-2"),  # name order
    (0.5, ["algo-1", "algo-2", "algo-3"], [], "algo-3"),
    (0.99, ["algo-2", "algo-3", "algo-4"], [], "algo-4"),
    (0.99, ["algo-1"], ["algo-1", "algo-5"], "algo-5"),  # no rank but the first's runs: one of the hosts up
    (0.3, [], ["algo-1"], None),  # the first host is never killed
])
def test_the_victim_is_chosen_among_the_hosts_running_a_rank_never_the_first(pick, running, up, expected):
    assert plan.victim(pick, running, up, "algo-1") == expected


@pytest.mark.parametrize("pick, expected", [(0.0, "algo-1"), (0.3, "algo-2"), (0.99, "algo-4")])
def test_schedule_c_may_kill_the_first_host(pick, expected):
    assert plan.victim(pick, ["algo-1", "algo-2", "algo-3", "algo-4"], [], None) == expected


def test_several_runs_are_a_median_with_min_and_max():
    assert plan.spread([0.9, 0.7, 0.8]) == "0.800 (0.700-0.900)"
    assert plan.spread([2.0, 1.0], " s", 1) == "1.5 s (1.0-2.0)"
    assert plan.spread([0.81]) == "0.810"
    assert plan.spread([]) == "—"


def test_goodput_is_the_work_over_the_wall_time():
    work = plan.work_s(300, 0.5)
    assert work == 150.0
    assert plan.goodput(work, 200.0) == 0.75
    assert plan.goodput(work, 150.0) == 1.0
    with pytest.raises(ValueError):
        plan.goodput(work, 0)


def test_each_kill_is_timed_to_the_last_rank_of_the_first_attempt_that_started_after_it():
    kills = [("algo-2", 10.0), ("algo-3", 30.0), ("algo-4", 50.0)]
    started = {0: [1.0, 1.2, 1.1, 1.3], 1: [14.0, 15.5, 14.2, 14.1], 2: [33.0, 33.0, 34.0, 36.5]}
    assert plan.recoveries(kills, started) == [5.5, 6.5, None]  # nothing started after the last kill
    # an attempt that starts only after the next kill counts for that one, not the earlier
    assert plan.recoveries([("algo-2", 10.0), ("algo-3", 12.0)], {0: [1.0], 1: [14.0, 15.0]}) == [None, 3.0]


def test_the_first_rank_of_the_next_attempt_running():
    kills = [("algo-2", 10.0), ("algo-3", 30.0)]
    started = {0: [1.0, 1.2], 1: [14.0, 15.5, 14.2], 2: [33.0, 36.5]}
    assert plan.recoveries(kills, started, which=min) == [4.0, 3.0]


def test_stamps_are_grouped_into_attempts_by_the_gaps_between_them():
    assert plan.attempts_by_time([15.5, 1.0, 14.0, 1.3, 33.0, 14.2, 1.1]) == {
        0: [1.0, 1.1, 1.3], 1: [14.0, 14.2, 15.5], 2: [33.0]}
    assert plan.attempts_by_time([1.0, 2.5, 4.0, 6.1], gap_s=2.0) == {0: [1.0, 2.5, 4.0], 1: [6.1]}
    assert plan.attempts_by_time([]) == {}


def test_a_row_says_wall_and_goodput_or_why_there_is_none():
    assert "0.750" in plan.row("ours", 150.0, 200.0) and "200.0s" in plan.row("ours", 150.0, 200.0)
    assert "failed: exit 1" in plan.row("torchrun", 150.0, None, "failed: exit 1")


def test_each_kill_is_matched_to_the_records_loss_of_that_host_seen_after_it():
    faults = [{"fault": "host_lost", "host": "algo-2", "detected_t": 100.4, "detection_s": 0.1, "barrier_s": 1.0,
               "start_s": 2.0, "lost_s": 3.1},
              {"fault": "failure", "host": "algo-3", "detected_t": 130.0, "detection_s": 0.0, "barrier_s": 1.0,
               "start_s": 1.0, "lost_s": 2.0}]
    assert plan.record_splits([("algo-2", 100.0), ("algo-3", 129.0), ("algo-2", 200.0)], faults) == [
        {"host": "algo-2", "outside_detection_s": 0.4, "detection_s": 0.1, "barrier_s": 1.0, "start_s": 2.0,
         "to_progress_s": 3.4}, None, None]
