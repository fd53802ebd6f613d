"""The ranks a host's train did not start, as their parents report them (supervise/reported.py)."""

from __future__ import annotations

import os

import pytest

from training_toolkit.supervise import procfs
from training_toolkit.supervise.reported import Reported, parse, reported


@pytest.mark.parametrize("name, text, expected", [
    ("4242", "3 987654\n", Reported(4242, 3, 987654)),
    ("4242", "0 1\n", Reported(4242, 0, 1)),
    ("7", "-1 55\n", Reported(7, None, 55)),  # the runtime named no rank
    ("4242", "3 987654", None),  # no newline: not written whole
    ("4242", "", None),
    ("4242", "3\n", None),
    ("4242", "3 98 7\n", None),
    ("4242", "x 98\n", None),
    ("4242", "-2 98\n", None),
    ("4242", "3 -98\n", None),
    (".4242.tmp", "3 98\n", None),  # a report still being written
    ("ranks", "3 98\n", None),
])
def test_a_report_is_a_pid_named_file_holding_the_rank_and_its_start(name, text, expected):
    assert parse(name, text) == expected


def test_only_reports_of_running_processes_that_started_when_reported_count_in_rank_order(tmp_path):
    me = procfs.read(os.getpid())
    parent = procfs.read(os.getppid())
    assert me is not None and parent is not None
    (tmp_path / str(me.pid)).write_text(f"5 {me.start}\n")
    (tmp_path / str(parent.pid)).write_text(f"2 {parent.start}\n")
    (tmp_path / "1").write_text("0 1\n")  # pid 1 is running, but started at another time: the pid was reused
    (tmp_path / "999999999").write_text("1 5\n")  # no such process: its parent was killed before removing it
    (tmp_path / f".{me.pid}.tmp").write_text("")
    assert reported(tmp_path) == [Reported(parent.pid, 2, parent.start), Reported(me.pid, 5, me.start)]
    assert reported(tmp_path / "missing") == []
