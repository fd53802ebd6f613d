"""`training-toolkit local` as a user runs it: output prefixed by host, exit code of the job, nothing left."""

from __future__ import annotations

import subprocess

import pytest

from helpers.jobs import clean_env, toolkit_cmd
from helpers.paths import REPO

pytestmark = [pytest.mark.root]


@pytest.mark.mpi
@pytest.mark.sshd
def test_the_mpi_example_on_two_local_hosts(tmp_path):
    result = subprocess.run(
        toolkit_cmd() + ["local", "--hosts", "2", "--source", str(REPO / "examples" / "mpi"), "--entry-point",
                         "allreduce.py", "--distribution", "mpi", "--processes-per-host", "2",
                         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=120, env=clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = sorted(line for line in result.stdout.splitlines() if "sum of ranks = 6" in line)
    assert len(ranks) == 4 and all(line.startswith("[algo-1] [1,") for line in ranks)
    assert "(SM_CURRENT_HOST=algo-2)" in result.stdout
    assert "algo-1: exit 0: success" in result.stderr and "algo-2: exit 0: success" in result.stderr
    assert (tmp_path / "work" / "algo-2" / "opt" / "ml" / "output" / "success").exists()


def test_a_failing_job_returns_its_code_and_names_the_cause(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "fail.py").write_text("import os, sys, time\nprint('hello from', os.environ['SM_CURRENT_HOST'], flush=True)\n"
                                 "if os.environ['SM_CURRENT_HOST'] == 'algo-1':\n"
                                 "    time.sleep(2)  # the other host has printed by then\n    sys.exit(7)\n")
    result = subprocess.run(
        toolkit_cmd() + ["local", "--hosts", "2", "--source", str(src), "--entry-point", "fail.py",
                         "--distribution", "multi_worker_mirrored", "--hp", "epochs=3", "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=120, env=clean_env())
    assert result.returncode == 7, result.stdout + result.stderr
    assert "[algo-1] hello from algo-1" in result.stdout and "[algo-2] hello from algo-2" in result.stdout
    assert "algo-2: exit 7: algo-1: fail.py exited with code 7" in result.stderr


def test_torch_distributed_gets_its_processes_per_host(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ranks.py").write_text("import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n")
    result = subprocess.run(
        toolkit_cmd() + ["local", "--hosts", "2", "--source", str(src), "--entry-point", "ranks.py",
                         "--distribution", "torch_distributed", "--processes-per-host", "2", "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=120, env=clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = sorted(line.split("] ", 1)[1] for line in result.stdout.splitlines() if "rank " in line)
    assert ranks == [f"rank {i} of 4" for i in range(4)]


@pytest.mark.parametrize("argv, message", [
    (["--hosts", "0", "--source", ".", "--entry-point", "x.py"], "--hosts must be at least 1"),
    (["--hosts", "2", "--source", "/nonexistent", "--entry-point", "x.py"], "x.py not found in /nonexistent"),
    (["--hosts", "2", "--source", str(REPO / "examples" / "mpi"), "--entry-point", "allreduce.py", "--hp", "novalue"],
     "--hp expects KEY=VALUE"),
    (["--hosts", "2", "--source", str(REPO / "examples" / "mpi"), "--entry-point", "allreduce.py",
      "--distribution", "parameter_server", "--processes-per-host", "2"],
     "--processes-per-host does not apply to parameter_server (one process per host)"),
    (["--hosts", "2", "--source", str(REPO / "examples" / "mpi"), "--entry-point", "allreduce.py",
      "--distribution", "mpi", "--processes-per-host", "0"], "--processes-per-host must be at least 1"),
])
def test_bad_arguments_are_named(argv, message):
    result = subprocess.run(toolkit_cmd() + ["local", *argv], capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 64, result.stderr
    assert f"training-toolkit: local: {message}" in result.stderr  # the toolkit's own line, as every other
