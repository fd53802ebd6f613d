"""The daemons mpirun starts over ssh do not wait on, or fail by, the user's shell start-up files.

sshd runs every session's command through the user's login shell (``SHELL -c``), and bash reads
``~/.bashrc`` (and ``/etc/bash.bashrc``) when it sees it was started by sshd.  A ``.bashrc`` that
initialises a Python environment manager, or waits on its lock, would make every launch wait; one
that exits ends the daemon's launch before it starts.  Each host here gets a throwaway ``/root``
(a bind mount inside its own mount namespace: the machine's ``/root`` is never touched) whose
``.bashrc`` sleeps 30 s, or exits 1; a 2-host MPI job still starts within its usual time and succeeds.
"""

from __future__ import annotations

import os
import time

import pytest

from helpers.multihost import hps, rank_files, run
from helpers.paths import OMPI5_BIN, TOOLKIT_PYTHON
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

HOSTS = ("algo-1", "algo-2")
SLEEPY = "echo bashrc-was-read >> ~/bashrc-ran\nsleep 30\n"
FAILING = "echo bashrc-was-read >> ~/bashrc-ran\nexit 1\n"
# Each rank says where it ran, under which Open MPI, and what its daemon (its parent: orted, prted, or
# mpirun on the first host) got from sshd's SetEnv
RANKS = f"""#!{TOOLKIT_PYTHON}
import json, os, socket
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
with open(f"/proc/{{os.getppid()}}/environ", "rb") as f:
    daemon = dict(e.decode().split("=", 1) for e in f.read().split(b"\\0") if b"=" in e)
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{{rank}}.json"), "w") as f:
    json.dump({{"rank": rank, "hostname": socket.gethostname(), "ompi_version": os.environ.get("OMPI_VERSION"),
               "daemon": {{k: daemon.get(k) for k in ("SHLVL", "ZDOTDIR", "TRAINING_TOOLKIT_NETSHIM_ALLOW")}}}}, f)
"""


def ranks_job(tmp_path, path: str | None = None) -> LocalJob:
    src = tmp_path / "src"
    src.mkdir()
    (src / "ranks").write_text(RANKS)
    (src / "ranks").chmod(0o755)
    env = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30", **({"PATH": path} if path else {})}
    return LocalJob(hosts=HOSTS, hyperparameters=hps("ranks", src, sagemaker_mpi_enabled=True,
                                                     sagemaker_mpi_num_of_processes_per_host=2), env=env)


def with_home(tmp_path, bashrc: str):
    """A ``before_start`` giving every host a throwaway home (over ``/root``) holding ``bashrc`` as ``.bashrc``."""
    homes = {}

    def before_start(cluster) -> None:
        for name in HOSTS:
            home = tmp_path / f"home-{name}"
            home.mkdir(mode=0o700)
            (home / ".bashrc").write_text(bashrc)
            (home / ".profile").write_text(bashrc)
            (home / ".zshenv").write_text(bashrc)
            cluster.run(name, ["mount", "--bind", str(home), "/root"], timeout=10, check=True)
            # the mount is the host's own: the machine's /root is not this one
            seen = cluster.run(name, ["cat", "/root/.bashrc"], timeout=10, capture_output=True, check=True)
            assert seen.stdout.decode() == bashrc
            homes[name] = home
    return before_start, homes


def check(results, took: float, homes, major: str) -> None:
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert [ranks[i]["hostname"] for i in range(4)] == ["algo-1", "algo-1", "algo-2", "algo-2"]
    # Open MPI 5 says its version to the ranks, 4 does not
    assert {(info["ompi_version"] or "4").split(".")[0] for info in ranks.values()} == {major}
    # a usual 2-host job takes a few seconds here; one .bashrc sleep alone would be 30
    assert took < 25, f"the job took {took:.1f} s"
    assert not any((home / "bashrc-ran").exists() for home in homes.values()), "a shell start-up file was read"
    # algo-2's daemon came through sshd: every variable of its one SetEnv line, the shim's included (bash gives
    # back the level it added when it execs its last command)
    daemon = ranks[2]["daemon"]
    assert daemon["SHLVL"] == "1" and daemon["ZDOTDIR"].startswith(("/run/training-toolkit-ssh-", "/tmp/")), daemon
    assert daemon["TRAINING_TOOLKIT_NETSHIM_ALLOW"], daemon


@pytest.mark.parametrize("bashrc", [SLEEPY, FAILING], ids=["sleeps-30s", "exits-1"])
def test_an_open_mpi_4_job_is_unaffected_by_the_users_bashrc(tmp_path, bashrc):
    before_start, homes = with_home(tmp_path, bashrc)
    t0 = time.monotonic()
    results = run(ranks_job(tmp_path), tmp_path, timeout_s=90, before_start=before_start)
    check(results, time.monotonic() - t0, homes, "4")


@pytest.mark.openmpi5
@pytest.mark.parametrize("bashrc", [SLEEPY, FAILING], ids=["sleeps-30s", "exits-1"])
def test_an_open_mpi_5_job_is_unaffected_by_the_users_bashrc(tmp_path, bashrc):
    """PRRTE's ssh launcher goes through the same sshd and the same shell."""
    before_start, homes = with_home(tmp_path, bashrc)
    t0 = time.monotonic()
    results = run(ranks_job(tmp_path, f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"), tmp_path, timeout_s=90,
                  before_start=before_start)
    check(results, time.monotonic() - t0, homes, "5")
