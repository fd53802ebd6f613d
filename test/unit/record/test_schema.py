"""The record's format: written as it goes, read back whole, a cut line skipped (record/schema.py)."""

from __future__ import annotations

import json

import pytest

from training_toolkit.record import schema


def test_each_entry_is_one_versioned_line_flushed_as_written_and_a_cut_last_line_is_skipped(tmp_path):
    path = schema.record_path(tmp_path, "algo-1")
    writer = schema.Writer(path)
    writer.write([schema.entry("job", "algo-1", 1.0, hosts=["algo-1"])])
    assert json.loads(path.read_text()) == {"v": 1, "t": 1.0, "by": "algo-1", "kind": "job", "hosts": ["algo-1"]}
    writer.write([schema.entry("verdict", "algo-1", 2.0, exit_code=0, reason=None)])
    with open(path, "a") as f:
        f.write('{"v": 1, "t": 3.0, "by": "algo-1", "kind": "fau')  # a kill mid-write
    assert [item["kind"] for item in schema.read(path)] == ["job", "verdict"]
    writer.close()
    assert path.parent.name == schema.DIR_NAME


def test_an_entry_with_fields_other_than_its_kinds_is_a_mistake_of_ours():
    with pytest.raises(AssertionError):
        schema.entry("verdict", "algo-1", 0.0, exit_code=0)


def test_a_record_that_cannot_be_written_is_said_once_and_never_fails_the_job(tmp_path, capfd):
    (tmp_path / "blocked").write_text("a file where the directory would go")
    writer = schema.Writer(schema.record_path(tmp_path / "blocked", "algo-1"))
    writer.write([schema.entry("job", "algo-1", 1.0, hosts=["algo-1"])])
    writer.write([schema.entry("job", "algo-1", 1.0, hosts=["algo-1"])])
    assert capfd.readouterr().err.count("the job's record stops here") == 1


def test_unknown_versions_and_kinds_are_not_read(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"v": 2, "kind": "job"}\n{"v": 1, "kind": "mystery"}\n[1]\n')
    assert schema.read(path) == [] and schema.read(tmp_path / "missing") == []
