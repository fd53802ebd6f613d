"""An outsider against every port a running MPI job opens, on a real 3-host local cluster (issue 17).

While the ranks run, the test lists every TCP listener of each host that is
not on loopback (``ss`` inside the host: mpirun, orted, the ranks' BTL, sshd,
the control channel) and the outsider, a namespace on the job's bridge, holds
a connection to each and sends garbage to each, over IPv4 and over IPv6
link-local.  Then the ranks exit while it still holds them.  Open MPI's own
listeners must be unreachable (the listener guard's filter drops the SYN), the
job must succeed, and every host must end within a second or so of the last
rank, not when the outsider lets go.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import threading
import time

import pytest

from helpers.multihost import FIXTURES, hps, ours_running, rank_files, source_dir
from helpers.paths import OMPI5_BIN, TOOLKIT_PYTHON
from training_toolkit import names
from training_toolkit.local.launcher import LocalJob, run_local

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

HOSTS = ("algo-1", "algo-2", "algo-3")
RUNTIME = ("mpirun", "orted", "prterun", "prted")
BTL_PORTS = range(names.MPI_BTL_PORT_MIN, names.MPI_BTL_PORT_MIN + names.MPI_BTL_PORT_RANGE)
HOLD_S = 20.0  # the outsider holds its connections this long after the ranks were told to exit
_LISTEN = re.compile(r'^LISTEN\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s+users:\(\("([^"]+)"')


def listeners(cluster, host: str) -> list[tuple[str, int, str]]:
    """(bound address, port, program) of every TCP listener in ``host`` not bound to loopback."""
    out = cluster.run(host, ["ss", "-Htlnp"], timeout=10, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        match = _LISTEN.match(line.strip())
        if match and match.group(1) not in ("127.0.0.1", "[::1]"):
            found.append((match.group(1), int(match.group(2)), match.group(3)))
    return found


def link_local(cluster, host: str) -> str | None:
    out = cluster.run(host, ["ip", "-6", "-o", "addr", "show", "scope", "link"], timeout=10,
                      capture_output=True, text=True).stdout
    match = re.search(r"^\d+:\s+(\S+)\s+inet6\s+(fe80::[0-9a-f:]+)/", out, re.M)
    return f"{match.group(2)}%eth0" if match else None


def targets(cluster, with_ranks: bool) -> list[list] | None:
    """Every (address, port, owner) to attack once each host shows the runtime's (and the ranks') listeners."""
    found = []
    for host in HOSTS:
        ports = listeners(cluster, host)
        programs = {program for _, _, program in ports}
        if not programs & set(RUNTIME) or (with_ranks and not programs & {"python", "hold_until"}):
            return None
        v4, v6 = cluster.host(host).address, link_local(cluster, host)
        for port in sorted({(port, program) for _, port, program in ports}):
            found.append([v4, port[0], f"{host} {port[1]}"])
            if v6:
                found.append([v6, port[0], f"{host} {port[1]} (IPv6 link-local)"])
    return found


def ompi4_job(tmp_path, until) -> LocalJob:
    src = source_dir(tmp_path, "hold_until.py")
    return LocalJob(hosts=HOSTS, hyperparameters=hps("hold_until.py", src, sagemaker_mpi_enabled=True,
                                                     sagemaker_mpi_num_of_processes_per_host=1, until=str(until)),
                    env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"}, outsiders=("stranger",))


def ompi5_job(tmp_path, until) -> LocalJob:
    """Open MPI 5's runtime with ranks that do not join MPI (mpi4py here is built against Debian's Open MPI 4)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "hold_until").write_text(f"#!{TOOLKIT_PYTHON}\n" + (FIXTURES / "hold_until.py").read_text())
    (src / "hold_until").chmod(0o755)
    return LocalJob(hosts=HOSTS, hyperparameters=hps("hold_until", src, sagemaker_mpi_enabled=True,
                                                     sagemaker_mpi_num_of_processes_per_host=1, until=str(until),
                                                     mpi="no"),
                    env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60",
                         "PATH": f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"},
                    outsiders=("stranger",))


@pytest.mark.parametrize("flavor", ["openmpi4", pytest.param("openmpi5", marks=pytest.mark.openmpi5)])
def test_an_outsider_holding_or_garbling_every_port_neither_reaches_open_mpi_nor_delays_the_end(tmp_path, flavor):
    results_file = tmp_path / "outsider.json"
    job = (ompi4_job if flavor == "openmpi4" else ompi5_job)(tmp_path, results_file)
    attack: dict = {}

    def start_attack(cluster) -> None:
        def run() -> None:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and (found := targets(cluster, flavor == "openmpi4")) is None:
                time.sleep(0.3)
            if found is None:
                attack["error"] = f"the job's listeners never all appeared: {[listeners(cluster, h) for h in HOSTS]}"
                results_file.write_text("{}")  # let the ranks go
                return
            attack["targets"] = found
            (tmp_path / "targets.json").write_text(json.dumps(found))
            env = {"PATH": os.environ["PATH"]}
            attack["proc"] = cluster.popen("stranger", [sys.executable, str(FIXTURES / "port_outsider.py"),
                                                        str(tmp_path / "targets.json"), str(results_file),
                                                        str(HOLD_S)], env=env)

        threading.Thread(target=run, daemon=True).start()

    out = io.BytesIO()
    try:
        results = run_local(job, tmp_path / "cluster", timeout_s=150, out=out, before_start=start_attack)
    finally:
        if "proc" in attack:
            attack["proc"].kill()
            attack["proc"].wait()
    log = out.getvalue().decode(errors="replace")
    assert "error" not in attack, attack.get("error")
    assert [r.exit_code for r in results] == [0, 0, 0], (log[-3000:], [r.failure for r in results])
    tried = json.loads(results_file.read_text())
    attempts = {key: value for key, value in tried.items() if key != "finished_at"}
    guarded = {key: value for key, value in attempts.items() if value["owner"].split()[1] in RUNTIME
               or int(key.rsplit(":", 1)[1]) in BTL_PORTS}
    assert {value["owner"].split()[1] for value in guarded.values()} >= {"mpirun" if flavor == "openmpi4" else "prterun"}
    assert len({value["owner"].split()[0] for value in guarded.values()}) == len(HOSTS), guarded  # every host's
    if flavor == "openmpi4":
        assert any(int(key.rsplit(":", 1)[1]) in BTL_PORTS for key in guarded), guarded  # the ranks' BTL too
    for key, value in guarded.items():
        assert value["hold"].startswith("failed") and value["garbage"].startswith("failed"), (key, value)
    others = {key: value for key, value in attempts.items() if key not in guarded}
    assert any(value["hold"] == "held" for value in others.values()), others  # the outsider's connections do work
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2] and all(info["waited"] for info in ranks.values()), ranks
    last_rank = max(info["exited_at"] for info in ranks.values())
    late = max(r.ended_at for r in results) - last_rank
    print(f"{flavor}: last rank to last host's end {late:.2f} s; {len(guarded)} guarded ports unreachable, "
          f"{sum(v['hold'] == 'held' for v in others.values())} other ports held")
    assert late < 3.0, f"the last host ended {late:.2f} s after the last rank (target 1 s; the outsider held {HOLD_S} s)"
    assert "Traceback" not in log
    assert not ours_running()
