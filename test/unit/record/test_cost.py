"""What faults cost, from a record: exact figures from hand-made entries (record/cost.py)."""

from __future__ import annotations

import re

from training_toolkit.record import cost, schema, summary


def e(kind: str, t: float, **fields) -> dict:
    return schema.entry(kind, "algo-1", t, **fields)


def attempt(t, n, active, spares=(), lead=None):
    return e("attempt", t, attempt=n, lead=lead or active[0], active=list(active), spares=list(spares))


def fault(t, n, kind, host, reason, at=None):
    return e("fault", t, attempt=n, fault=kind, host=host, reason=reason, at=at)


# a job of 3 hosts and a spare: algo-2 lost at 110 (its loss detected at 111), the spare seated at 115,
# its first progress at 118; algo-1 lost later is the lead's loss seen by a follower: not here
LOST_HOST = [
    e("job", 100.0, hosts=["algo-1", "algo-2", "algo-3", "algo-4"]),
    attempt(101.0, 0, ["algo-1", "algo-2", "algo-3"], ["algo-4"]),
    e("started", 101.5, attempt=0),
    e("progress", 103.0, attempt=0, heartbeat=False),
    fault(111.0, 0, "host_lost", "algo-2", "algo-2 lost: connection closed", at=110.0),
    fault(111.2, 0, "failure", "algo-3", "algo-3: rank 2 exited 1", at=111.1),  # a consequence, not the cause
    e("restart", 111.3, attempt=1, reason="algo-2 lost: connection closed", lost=None),
    attempt(115.0, 1, ["algo-1", "algo-4", "algo-3"]),
    e("started", 115.2, attempt=1),
    e("progress", 118.0, attempt=1, heartbeat=False),
    e("verdict", 130.0, exit_code=0, reason=None),
]


def test_a_lost_host_costs_from_its_loss_to_the_next_attempts_first_progress_split_three_ways():
    doc = cost.cost(LOST_HOST)
    assert doc["wall_s"] == 30.0 and doc["basis"] == "progress" and doc["lost_work_included"] is False
    assert [(a["attempt"], a["to_progress_s"], a["running_s"]) for a in doc["attempts"]] == [(0, 2.0, 12.0),
                                                                                           (1, 3.0, 12.0)]
    assert doc["faults"] == [{"attempt": 0, "fault": "host_lost", "host": "algo-2",
                              "reason": "algo-2 lost: connection closed", "detected_t": 111.0, "detection_s": 1.0,
                              "barrier_s": 4.0, "start_s": 3.0, "lost_s": 8.0, "lost_work_s": None,
                              "next_attempt": 1}]
    assert doc["downtime_s"] == 8.0
    assert doc["running_fraction"] == 0.8  # (12 + 12) / 30
    assert (doc["checkpoints"], doc["lost_work_s"], doc["goodput"]) == (0, None, None)  # no mark: not known
    assert doc["verdict"] == {"exit_code": 0, "reason": None}


def test_without_progress_the_processes_start_is_the_basis_and_the_last_fault_ends_the_job():
    entries = [e("job", 0.0, hosts=["algo-1"]), attempt(0.0, 0, ["algo-1"]), e("started", 1.0, attempt=0),
               fault(9.0, 0, "failure", "algo-1", "algo-1: exited 1", at=8.5),
               e("verdict", 10.0, exit_code=1, reason="algo-1: exited 1")]
    doc = cost.cost(entries)
    assert doc["basis"] == "started"
    assert doc["attempts"][0]["to_progress_s"] == 1.0 and doc["attempts"][0]["running_s"] == 9.0
    (only,) = doc["faults"]
    assert (only["lost_s"], only["next_attempt"], only["detection_s"]) == (None, None, 0.5)
    assert doc["downtime_s"] == 0.0 and doc["running_fraction"] == 0.9


def mark(t, n, host="algo-1", at=None):
    return e("checkpoint", t, attempt=n, host=host, at=at)


def test_with_checkpoint_marks_each_fault_loses_the_work_since_the_last_mark_and_goodput_nets_it_out():
    # LOST_HOST's job, its script marking checkpoints at 104 and 107 (before algo-2's loss at 110), and at 121
    entries = [*LOST_HOST[:4], mark(104.0, 0), mark(107.0, 0, "algo-3"), *LOST_HOST[4:10], mark(121.0, 1),
               LOST_HOST[10]]
    doc = cost.cost(entries)
    (only,) = doc["faults"]
    assert only["lost_work_s"] == 3.0  # 110 - 107: the loss's own time, not its detection's
    assert (doc["lost_work_included"], doc["checkpoints"], doc["lost_work_s"]) == (True, 3, 3.0)
    assert doc["goodput"] == 0.7  # (12 + 12 - 3) / 30
    text = summary.line(doc)
    assert " goodput=0.7000;" in text and "and 3.000 s of work since the last checkpoint" in text
    assert re.search(summary.METRICS["toolkit:goodput"], "training-toolkit: " + text).group(1) == "0.7000"


def test_a_mark_the_lead_told_of_counts_when_the_lead_told_not_when_this_host_handled_it():
    # LOST_HOST's job; algo-3's mark at 107 by the lead's clock, handled here only at 111 (after algo-2's loss at 110)
    entries = [*LOST_HOST[:4], mark(104.0, 0), *LOST_HOST[4:6], mark(111.0, 0, "algo-3", at=107.0), *LOST_HOST[6:]]
    assert cost.cost(entries)["faults"][0]["lost_work_s"] == 3.0  # 110 - 107, not 110 - 104
    entries[7] = mark(111.0, 0, "algo-3")  # stamped when handled: after the loss, so the work since 104 is lost
    assert cost.cost(entries)["faults"][0]["lost_work_s"] == 6.0


def test_an_attempt_that_marked_nothing_before_its_fault_lost_all_it_ran():
    entries = [attempt(0.0, 0, ["algo-1", "algo-2"]), e("progress", 1.0, attempt=0, heartbeat=False),
               mark(3.0, 0), fault(6.0, 0, "failure", "algo-2", "x", at=6.0), e("restart", 6.0, attempt=1, reason="x",
                                                                                lost=None),
               attempt(7.0, 1, ["algo-1", "algo-2"]), e("progress", 8.0, attempt=1, heartbeat=False),
               fault(12.0, 1, "failure", "algo-2", "y", at=11.5), e("restart", 12.0, attempt=2, reason="y", lost=None),
               attempt(13.0, 2, ["algo-1", "algo-2"]), e("progress", 13.5, attempt=2, heartbeat=False),
               fault(20.0, 2, "failure", "algo-2", "z", at=13.2),  # before its attempt's first progress: no work lost
               e("verdict", 20.0, exit_code=1, reason="z")]
    assert [f["lost_work_s"] for f in cost.cost(entries)["faults"]] == [3.0, 3.5, 0.0]  # 6-3; 11.5-8 (mark at 3 < 8)


def test_a_fault_times_own_clock_after_its_detection_counts_as_detected_then():
    entries = [attempt(0.0, 0, ["algo-1", "algo-2"]), e("started", 0.0, attempt=0),
               fault(5.0, 0, "failure", "algo-2", "x", at=7.0), e("restart", 5.0, attempt=1, reason="x", lost=None),
               attempt(6.0, 1, ["algo-1", "algo-2"]), e("started", 6.5, attempt=1), e("verdict", 9.0, exit_code=0,
                                                                                     reason=None)]
    (only,) = cost.cost(entries)["faults"]
    assert (only["detection_s"], only["barrier_s"], only["start_s"], only["lost_s"]) == (0.0, 1.0, 0.5, 1.5)


def test_an_empty_record_costs_nothing_and_says_so():
    doc = cost.cost([])
    assert (doc["wall_s"], doc["attempts"], doc["faults"], doc["running_fraction"], doc["basis"]) == \
        (0.0, [], [], None, "none")


def test_the_summary_line_reads_with_every_documented_regex():
    text = "training-toolkit: " + summary.line(cost.cost(LOST_HOST))
    assert text.startswith("training-toolkit: summary: attempts=2 faults=1 downtime_s=8.000 "
                           "running_fraction=0.8000 wall_s=30.000 basis=progress; attempt 1: host_lost")
    read = {name: found.group(1) for name, regex in summary.METRICS.items() if (found := re.search(regex, text))}
    assert read == {"toolkit:attempts": "2", "toolkit:faults": "1", "toolkit:downtime_s": "8.000",
                    "toolkit:running_fraction": "0.8000", "toolkit:wall_s": "30.000"}  # no goodput: no mark
    assert "lost 8.000 s (detection 1.000, barrier 4.000, start 3.000)" in text


def test_the_summary_line_stays_under_the_channels_text_limit_however_many_faults():
    entries = [e("job", 0.0, hosts=["algo-1"])]
    for n in range(40):
        entries += [attempt(n * 10.0, n, ["algo-1", "algo-2"]), e("started", n * 10 + 1.0, attempt=n),
                    fault(n * 10 + 5.0, n, "failure", "algo-2", "q'\";" * 100, at=None),
                    e("restart", n * 10 + 5.0, attempt=n + 1, reason="r", lost=None)]
    entries.append(e("verdict", 500.0, exit_code=1, reason="r"))
    line = summary.line(cost.cost(entries))
    assert len(line) < 4096 and line.endswith("30 more in the cost document")


def test_a_restart_a_follower_only_heard_of_is_charged_from_the_call_with_its_reason():
    entries = [attempt(0.0, 0, ["algo-1", "algo-2"]), e("started", 0.5, attempt=0),
               e("restart", 4.0, attempt=1, reason="algo-1: rank 0 exited 1", lost=None),
               attempt(5.0, 1, ["algo-1", "algo-2"]), e("started", 6.0, attempt=1),
               e("verdict", 10.0, exit_code=0, reason=None)]
    (only,) = cost.cost(entries)["faults"]
    assert (only["fault"], only["reason"], only["detection_s"], only["barrier_s"], only["start_s"], only["lost_s"]) == \
        ("restart", "algo-1: rank 0 exited 1", 0.0, 1.0, 1.0, 2.0)


def test_a_stalls_cause_is_the_restarts_reason_which_names_the_stuck_rank():
    entries = [attempt(0.0, 0, ["algo-1"]), e("progress", 1.0, attempt=0, heartbeat=False),
               fault(10.0, 0, "stall", None, "no progress within the stall timeout", at=5.0),
               e("restart", 12.0, attempt=1, reason="stalled: rank 3 on algo-2 in allreduce", lost=None),
               attempt(13.0, 1, ["algo-1"]), e("progress", 14.0, attempt=1, heartbeat=False),
               e("verdict", 20.0, exit_code=0, reason=None)]
    (only,) = cost.cost(entries)["faults"]
    assert (only["reason"], only["detection_s"], only["lost_s"]) == ("stalled: rank 3 on algo-2 in allreduce", 5.0, 9.0)
