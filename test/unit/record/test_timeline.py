"""The job drawn: what the picture shows, from several hosts' records (record/timeline.layout, pure), and its SVG."""

from __future__ import annotations

import json

import pytest

from training_toolkit.record import schema, timeline

HOSTS = ["algo-1", "algo-2", "algo-3"]


def e(by: str, kind: str, t: float, **fields) -> dict:
    return schema.entry(kind, by, t, **fields)


def attempt(by, t, n, active, spares=()):
    return e(by, "attempt", t, attempt=n, lead=active[0], active=list(active), spares=list(spares))


# algo-1 leads attempt 0 and is lost at 10 (killed: its record stops at 5); algo-2 leads attempt 1 with the spare
RECORDS = {
    "algo-1": [e("algo-1", "job", 100.0, hosts=HOSTS), attempt("algo-1", 101.0, 0, HOSTS[:2], HOSTS[2:]),
               e("algo-1", "started", 101.0, attempt=0), e("algo-1", "progress", 105.0, attempt=0, heartbeat=False)],
    "algo-2": [e("algo-2", "job", 100.2, hosts=HOSTS), attempt("algo-2", 101.1, 0, HOSTS[:2], HOSTS[2:]),
               e("algo-2", "started", 101.2, attempt=0), e("algo-2", "progress", 103.0, attempt=0, heartbeat=False),
               e("algo-2", "fault", 110.0, attempt=0, fault="host_lost", host="algo-1",
                 reason="lost the lead algo-1 (connection closed)", at=110.0),
               e("algo-2", "restart", 112.0, attempt=1, reason="lost the lead algo-1", lost="algo-1"),
               attempt("algo-2", 114.0, 1, ["algo-2", "algo-3"]), e("algo-2", "started", 114.0, attempt=1),
               e("algo-2", "progress", 116.0, attempt=1, heartbeat=False),
               e("algo-2", "verdict", 120.0, exit_code=0, reason=None)],
    "algo-3": [e("algo-3", "job", 100.4, hosts=HOSTS), attempt("algo-3", 101.1, 0, HOSTS[:2], HOSTS[2:]),
               e("algo-3", "fault", 110.1, attempt=0, fault="host_lost", host="algo-1",
                 reason="lost the lead algo-1 (connection closed)", at=110.1),
               attempt("algo-3", 114.1, 1, ["algo-2", "algo-3"]), e("algo-3", "verdict", 120.1, exit_code=0,
                                                                   reason=None)],
}


def test_each_hosts_role_per_attempt_each_fault_once_and_the_time_it_cost():
    picture = timeline.layout(RECORDS)
    assert picture.hosts == tuple(HOSTS)
    assert [(s.host, s.role, s.start, s.end, s.attempt) for s in picture.segments] == [
        ("algo-1", "lead", 1.0, 10.0, 0), ("algo-1", "lost", 10.0, 14.0, 0),  # lost from its loss on
        ("algo-2", "active", 1.0, 14.0, 0), ("algo-3", "spare", 1.0, 14.0, 0),
        ("algo-1", "lost", 14.0, 20.1, 1), ("algo-2", "lead", 14.0, 20.1, 1), ("algo-3", "active", 14.0, 20.1, 1)]
    assert picture.marks == (timeline.Mark(10.0, 0, "host_lost", "algo-1",
                                           "host_lost: lost the lead algo-1 (connection closed)"),)
    assert picture.shaded == ((10.0, 16.0),)  # from the loss to attempt 2's first progress, in algo-2's record
    assert picture.title.startswith("summary: attempts=2 faults=1 downtime_s=6.000")
    assert picture.end == 20.1


def test_no_record_is_no_picture(tmp_path):
    with pytest.raises(ValueError):
        timeline.layout({})
    assert timeline.main(tmp_path, None) == 64


def test_the_svg_names_every_host_and_fault_and_the_title_as_text(tmp_path):
    pytest.importorskip("matplotlib")
    for host, entries in RECORDS.items():  # as local's work directory holds them: one tree per host
        path = schema.record_path(tmp_path / host / "opt" / "ml" / "output" / "data", host)
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(item) + "\n" for item in entries))
    assert sorted(timeline.find_records(tmp_path)) == HOSTS
    out = tmp_path / "job.svg"
    assert timeline.main(tmp_path, out) == 0
    svg = out.read_text()
    for text in (*HOSTS, "host_lost: lost the lead algo-1 (connection closed)", "attempts=2 faults=1", "time lost",
                 "lead", "spare"):
        assert f">{text}<" in svg or text in svg, text
    assert svg.count("#c00000") >= 1  # the fault's line
