"""An outsider on a real local cluster: a namespace on the job's bridge that is not one of its hosts.

It knows the job name, the host names, the hyperparameters and the toolkit's code
(test/fixtures/scripts/outsider.py).  Every attempt must fail, the job must still
succeed, and nothing may be left running.  See docs/security.md.
"""

from __future__ import annotations

import glob
import io
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from helpers.multihost import FIXTURES, hps, ours_running, rank_files, run, source_dir
from helpers.keys import mount_keys
from training_toolkit.cluster.ssh.keys import generate_keypair
from training_toolkit.local.launcher import LocalJob, run_local

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

HOSTS = ("algo-1", "algo-2", "algo-3")
JOB_NAME = "tensorflow-training-2026-11-22-10-00-00-000"
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"}


@pytest.mark.parametrize("platform_secret", [False, True], ids=["no-secret", "platform-secret"])
def test_an_outsider_gets_nowhere_and_the_job_still_succeeds(tmp_path, platform_secret):
    src = source_dir(tmp_path, "wait_for_file.py")
    results_file = tmp_path / "outsider.json"
    job = LocalJob(hosts=HOSTS, hyperparameters=hps("wait_for_file.py", src, sagemaker_mpi_enabled=True,
                                                    sagemaker_mpi_num_of_processes_per_host=1,
                                                    sagemaker_job_name=JOB_NAME, until=str(results_file)),
                   env=FAST, platform_secret=platform_secret, outsiders=("stranger",))
    outsider = {}

    def start_outsider(cluster):
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        outsider["proc"] = cluster.popen("stranger", [sys.executable, str(FIXTURES / "outsider.py"), str(results_file),
                                                      JOB_NAME, "algo-1", "algo-2", *HOSTS], env=env)
        outsider["address"] = cluster.host("stranger").address

    out = io.BytesIO()
    started = time.monotonic()
    try:
        results = run_local(job, tmp_path / "cluster", environ=os.environ, timeout_s=120, out=out, before_start=start_outsider)
    finally:
        if "proc" in outsider:
            outsider["proc"].kill()
            outsider["proc"].wait()
    log = out.getvalue().decode(errors="replace")
    assert [r.exit_code for r in results] == [0, 0, 0], (log[-3000:], [r.failure for r in results])
    assert all(info["waited"] for info in rank_files(results).values()), "the job ended before the outsider was done"
    assert time.monotonic() - started < 90
    tried = json.loads(results_file.read_text())
    assert tried["control port up"] and tried["sshd up"]
    assert tried["claim a worker's seat"].startswith("refused"), tried
    for attempt in ("garbage", "truncated", "oversized", "nested", "forged verdict"):
        assert tried[attempt].startswith("closed"), (attempt, tried[attempt])
    assert tried["flood"]["opened"] >= 900, tried["flood"]
    assert tried["ssh with the old derived key"].startswith("refused"), tried
    assert tried["ssh with a key of its own"].startswith("refused"), tried
    master_lines = [line for line in log.splitlines() if line.startswith("[algo-1]")]
    refusals = [line for line in master_lines if f"refused a connection from {outsider['address']}" in line]
    assert refusals, log[-3000:]
    assert len(refusals) <= 10, refusals  # one line per kind of refusal, not one per connection
    assert any(f"more connection(s) from {outsider['address']}" in line for line in master_lines)
    assert "Traceback" not in log
    assert not ours_running()


def test_mounted_keys_at_0644_without_a_secret(tmp_path):
    """A Kubernetes-style secret volume of keys: world-readable files, used as they are."""
    client, host = generate_keypair("client"), generate_keypair("host")
    keys = mount_keys(tmp_path / "keys", client, host)
    src = source_dir(tmp_path, "mpi_allreduce.py")
    job = LocalJob(hosts=HOSTS[:2], hyperparameters=hps("mpi_allreduce.py", src, sagemaker_mpi_enabled=True,
                                                        sagemaker_mpi_num_of_processes_per_host=1),
                   env={**FAST, "TRAINING_TOOLKIT_SSH_KEYS": str(keys)}, platform_secret=False)
    results = run(job, tmp_path)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    assert sorted(rank_files(results)) == [0, 1]
    assert stat.S_IMODE((keys / "id_ed25519").stat().st_mode) == 0o644  # the mount is left alone


def steal_client_key(cluster, host: str, into) -> str:
    """A copy of ``host``'s job client key (as someone already on it could take it): its path."""
    (found,) = glob.glob(f"/proc/{cluster.host(host).pid}/root/run/training-toolkit-ssh-*/client_key")
    into.write_bytes(open(found, "rb").read())
    into.chmod(0o600)
    return str(into)


def login(cluster, from_host: str, key: str, to_host: str) -> str:
    """An ssh login from ``from_host`` to ``to_host``'s sshd with ``key`` alone, host keys unchecked (an attacker's)."""
    argv = ["ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
            f"root@{to_host}", "echo", "in"]
    out = cluster.run(from_host, argv, env={"PATH": os.environ["PATH"]}, timeout=30, capture_output=True,
                      stdin=subprocess.DEVNULL)
    text = out.stdout.decode(errors="replace")
    return "logged in" if out.returncode == 0 and "in" in text else "refused: " + out.stderr.decode(errors="replace")[-200:]


def test_a_hosts_key_opens_nothing_from_another_address_nor_another_jobs_hosts(tmp_path):
    """Every host holds a client key (tree spawn), admitted only where its host launches something (the lead's on
    every worker, below routed_radix + 2 hosts no other), from its own host's address only, and only by the job
    that made it.  The lead's key copied off algo-1 (someone already on it) logs in to algo-3 from algo-1 (the
    control: it is a working key), but not from the outsider's address nor from algo-3's (another job host), and
    not into the next job on the same hosts, at the same addresses, even from algo-1; algo-2's own key opens
    nothing on algo-3, even from algo-2 (algo-2 launches nothing there)."""
    src = source_dir(tmp_path, "wait_for_file.py")
    tried: dict[str, str] = {}

    def job(n: int) -> LocalJob:
        until = tmp_path / f"done-{n}"
        return LocalJob(hosts=HOSTS, env=FAST, outsiders=("stranger",),
                        hyperparameters=hps("wait_for_file.py", src, sagemaker_mpi_enabled=True,
                                            sagemaker_mpi_num_of_processes_per_host=1, until=str(until)))

    def attempts(n: int, cluster_of: dict):
        def on_start(procs):
            cluster = cluster_of["cluster"]
            try:
                wait_for_keys(cluster)
                key = steal_client_key(cluster, "algo-1", tmp_path / f"algo-1-key-{n}")
                tried[f"{n}: the lead's key from the lead"] = login(cluster, "algo-1", key, "algo-3")
                if n == 1:
                    tried["1: the lead's key from the outsider"] = login(cluster, "stranger", key, "algo-3")
                    tried["1: the lead's key from algo-3"] = login(cluster, "algo-3", key, "algo-2")
                    own = steal_client_key(cluster, "algo-2", tmp_path / "algo-2-key")
                    tried["1: algo-2's key from algo-2"] = login(cluster, "algo-2", own, "algo-3")
                else:
                    tried["2: job 1's lead key from the lead"] = login(cluster, "algo-1", str(tmp_path / "algo-1-key-1"),
                                                                       "algo-3")
            finally:
                (tmp_path / f"done-{n}").touch()
        return on_start

    for n in (1, 2):
        cluster_of: dict = {}
        results = run(job(n), tmp_path / f"run-{n}", before_start=lambda c, box=cluster_of: box.update(cluster=c),
                      on_start=attempts(n, cluster_of))
        assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    assert tried["1: the lead's key from the lead"] == "logged in", tried
    assert tried["2: the lead's key from the lead"] == "logged in", tried
    assert tried["1: the lead's key from the outsider"].startswith("refused"), tried
    assert tried["1: the lead's key from algo-3"].startswith("refused"), tried
    assert tried["1: algo-2's key from algo-2"].startswith("refused"), tried
    assert tried["2: job 1's lead key from the lead"].startswith("refused"), tried
    assert not ours_running()


def wait_for_keys(cluster, timeout_s: float = 90) -> None:
    """Until algo-1 and algo-2 hold their client keys and algo-2's and algo-3's sshd admit the job's keys (after the
    go)."""
    deadline = time.monotonic() + timeout_s

    def written(host: str, name: str) -> bool:
        found = glob.glob(f"/proc/{cluster.host(host).pid}/root/run/training-toolkit-ssh-*/{name}")
        return bool(found) and os.path.getsize(found[0]) > 0

    while not (written("algo-1", "client_key") and written("algo-2", "client_key") and written("algo-2", "authorized_keys")
               and written("algo-3", "authorized_keys")):
        assert time.monotonic() < deadline, "the workers never admitted the job's keys"
        time.sleep(0.1)
