"""Where a host's runtime files go (rundir.choose_parent): the pure rule, and the directories it makes."""

from __future__ import annotations

import os
from pathlib import Path

from training_toolkit.supervise import rundir
from training_toolkit.supervise.rundir import DirFacts, choose_parent

UID = 1000


def looking(**dirs: DirFacts):
    """A ``look`` over the named directories (their paths' text as keys, '/' written as '_'); others do not exist."""
    table = {Path(name.replace("_", "/")): facts for name, facts in dirs.items()}
    return lambda path: table.get(path)


MINE = DirFacts(UID, 0o700, True)
ROOTS_RUN = DirFacts(0, 0o755, False)


def test_root_and_containers_use_run():
    assert choose_parent({}, 0, looking(_run=DirFacts(0, 0o755, True))) == Path("/run")
    # /run wins over every variable where it can be written
    assert choose_parent({"XDG_RUNTIME_DIR": "/run/user/0", "TMPDIR": "/scratch"}, 0,
                         looking(_run=DirFacts(0, 0o755, True), _run_user_0=DirFacts(0, 0o700, True))) == Path("/run")


def test_an_ordinary_user_gets_their_own_runtime_dir():
    env = {"XDG_RUNTIME_DIR": "/run/user/1000", "TMPDIR": "/scratch/job"}
    look = looking(_run=ROOTS_RUN, _run_user_1000=MINE, _scratch_job=MINE)
    assert choose_parent(env, UID, look) == Path("/run/user/1000")


def test_a_runtime_dir_that_is_not_ours_here_is_passed_over():
    """sbatch exports the submitting shell's XDG_RUNTIME_DIR: on a node it may be missing, another's, or open."""
    env = {"XDG_RUNTIME_DIR": "/run/user/1000", "TMPDIR": "/scratch/job"}
    for runtime in (None, DirFacts(1001, 0o700, True), DirFacts(UID, 0o755, True), DirFacts(UID, 0o700, False)):
        look = looking(_run=ROOTS_RUN, _scratch_job=MINE, **({"_run_user_1000": runtime} if runtime else {}))
        assert choose_parent(env, UID, look) == Path("/scratch/job"), runtime


def test_tmpdir_then_tmp():
    assert choose_parent({"TMPDIR": "/scratch/job"}, UID, looking(_run=ROOTS_RUN, _scratch_job=MINE)) == Path("/scratch/job")
    # a shared, sticky TMPDIR is fine: each directory made in it has a random name and is 0700
    shared = DirFacts(0, 0o1777, True)
    assert choose_parent({"TMPDIR": "/scratch"}, UID, looking(_run=ROOTS_RUN, _scratch=shared)) == Path("/scratch")
    for env in ({}, {"TMPDIR": "/gone"}, {"TMPDIR": "relative/dir"}, {"TMPDIR": ""}, {"XDG_RUNTIME_DIR": "run/user/1"}):
        assert choose_parent(env, UID, looking(_run=ROOTS_RUN, _scratch=MINE, _gone=None)) == Path("/tmp"), env
    assert choose_parent({"TMPDIR": "/ro"}, UID, looking(_run=ROOTS_RUN, _ro=DirFacts(UID, 0o500, False))) == Path("/tmp")


def test_this_hosts_facts_and_new_private_dirs(tmp_path):
    assert rundir.look(tmp_path) == DirFacts(os.geteuid(), tmp_path.stat().st_mode & 0o7777, True)
    (tmp_path / "file").write_text("")
    assert rundir.look(tmp_path / "file") is None and rundir.look(tmp_path / "gone") is None
    a, b = rundir.new_private_dir("x-", tmp_path), rundir.new_private_dir("x-", tmp_path)
    assert a != b and a.parent == tmp_path and a.name.startswith("x-")
    assert oct(a.stat().st_mode & 0o777) == "0o700"
    assert rundir.parent({"TMPDIR": str(tmp_path)}) in (Path("/run"), tmp_path)  # /run where we are root
