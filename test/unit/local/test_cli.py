"""``training-toolkit local``'s checks of its directories: a workdir that the copies would run into is refused first."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from training_toolkit.core.errors import EXIT_USAGE
from training_toolkit.local import cli, launcher
from training_toolkit.local.cli import overlap

HOSTS = ("algo-1", "algo-2")


@pytest.mark.parametrize(("source", "workdir", "said"), [
    ("/code", "/code/run", "--workdir /code/run is inside --source /code"),  # the new user's try
    ("/code", "/code", "--workdir /code is inside --source /code"),
    ("/w/algo-2", "/w", "--source /w/algo-2 holds /w/algo-2/opt/ml/code, where host algo-2 copies it"),
    ("/w/algo-1/opt/ml", "/w", "holds /w/algo-1/opt/ml/code"),
    ("/w/algo-1/opt/ml/code", "/w", "--source /w/algo-1/opt/ml/code is in host algo-1's copy of it, "
                                    "/w/algo-1/opt/ml/code"),
    ("/w/algo-1/opt/ml/code/x", "/w", "is in host algo-1's copy of it, /w/algo-1/opt/ml/code,"),
])
def test_a_copy_into_itself_is_refused_naming_both_paths(source, workdir, said):
    why = overlap(Path(source), Path(workdir), {}, HOSTS)
    assert why is not None and said in why and workdir in why


@pytest.mark.parametrize(("source", "workdir"), [
    ("/code", "/run"), ("/code", "/codex/run"), ("/a/code", "/a"),  # a workdir beside or above the code
    ("/w/code", "/w"), ("/w/algo-3", "/w"), ("/w/algo-1/other", "/w"),  # elsewhere in the workdir
    ("/w/algo-1/opt/ml/model", "/w"),
])
def test_the_code_beside_or_elsewhere_in_the_workdir_is_fine(source, workdir):
    assert overlap(Path(source), Path(workdir), {}, HOSTS) is None


def test_channels_are_checked_as_the_code_is():
    assert "--workdir /data/w is inside --channel train /data" in overlap(Path("/code"), Path("/data/w"),
                                                                          {"train": Path("/data")}, HOSTS)
    assert "--channel train /w/algo-1/opt/ml/input/data/train is in host algo-1's copy" in overlap(
        Path("/code"), Path("/w"), {"train": Path("/w/algo-1/opt/ml/input/data/train")}, HOSTS)
    assert overlap(Path("/code"), Path("/w"), {"train": Path("/w/algo-1/opt/ml/model")}, HOSTS) is None


@pytest.fixture
def nothing_starts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the hosts were started")

    monkeypatch.setattr(launcher, "run_local", refuse)


def test_local_refuses_before_anything_is_made(tmp_path, capsys, nothing_starts):
    source = tmp_path / "code"
    source.mkdir()
    (source / "train.py").write_text("pass\n")
    workdir = source / "run"
    code = cli.main(["--source", str(source), "--entry-point", "train.py", "--workdir", str(workdir)], {})
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--workdir {workdir} is inside --source {source}" in err
    assert not workdir.exists()


def test_the_default_workdir_is_checked_before_it_is_made(tmp_path, monkeypatch, capsys, nothing_starts):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "train.py").write_text("pass\n")
    code = cli.main(["--source", str(tmp_path), "--entry-point", "train.py"], {})
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"is inside --source {tmp_path}" in err and "the default --workdir is a new directory there" in err
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]


def test_spares_are_more_hosts_and_the_maximum_is_the_hosts(tmp_path, monkeypatch, capsys):
    seen = []

    def record(job, workdir, **kw):
        seen.append(job)
        return []

    monkeypatch.setattr(launcher, "run_local", record)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("pass\n")
    base = ["--source", str(tmp_path / "code"), "--entry-point", "train.py", "--workdir", str(tmp_path / "w")]
    cli.main([*base, "--hosts", "3", "--spares", "1", "--env", "TRAINING_TOOLKIT_MAX_RESTARTS=2"], {})
    assert tuple(seen[0].hosts) == ("algo-1", "algo-2", "algo-3", "algo-4")
    assert seen[0].env == {"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MAX_RESTARTS": "2"}
    cli.main([*base, "--hosts", "2"], {})  # none: as before
    assert tuple(seen[1].hosts) == ("algo-1", "algo-2") and seen[1].env == {}
    assert cli.main([*base, "--spares", "-1"], {}) == EXIT_USAGE
