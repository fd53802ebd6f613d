"""The accept() shim in real containers: an outsider container on the job's network against a 2-host MPI job.

The engine's default gives a container no CAP_NET_ADMIN, so the listener guard cannot
attach its filters and only cuts (it says so).  While the ranks wait, a container of
the same image on the job's network, not a host of the job, holds a connection to every
listener of both hosts and sends 4 KiB of garbage to each (test/fixtures/scripts/
port_outsider.py).  With the shim the job succeeds with no word of Open MPI's in its
output; with ``TRAINING_TOOLKIT_NETSHIM=off`` what the runtime and the BTL read shows.
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from helpers.multihost import hps, source_dir
from helpers.paths import FIXTURES, IMAGE
from training_toolkit.core import names
from training_toolkit.local import engine
from training_toolkit.local.container_launcher import run_containers
from training_toolkit.local.containers import CODE_DIR, LABEL_JOB, host_names, new_job_id
from training_toolkit.local.layout import host_opt_ml
from training_toolkit.local.job import LocalJob

pytestmark = [pytest.mark.containers]

BTL = range(names.MPI_BTL_PORT_MIN, names.MPI_BTL_PORT_MIN + names.MPI_BTL_PORT_RANGE)
COMPLAINTS = ("oob", "btl", "ORTE", "orted", "unexpected", "lost communication", "identifier", "mca_", "connect_ack",
              "invalid header")
OPEN_MPI_LINE = re.compile(r"\[[\w.-]+:\d{3,}\] ")  # Open MPI's own prefix: [algo-1:00022] tcp_peer_recv_connect_ack: ...


@pytest.fixture(scope="module")
def client():
    c = engine.connect(engine.socket_url(os.environ))
    yield c
    c.close()


LISTENERS = ("import json; from training_toolkit.cluster import listeners as l; "
             "print(json.dumps([r.local for r in l.tcp_sockets().values() if r.state == l.LISTEN]))")


def listening(container) -> set[int]:
    """The ports a host's processes listen on, not on loopback (asked of the kernel inside it, as the guard asks)."""
    out = container.exec_run(["python", "-c", LISTENERS]).output  # the image's venv, first on its PATH
    return {port for address, port in json.loads(out) if not address.startswith("127.") and address != "::1"}


def attack(client, job_id: str, hosts, workdir: Path, state: dict) -> None:
    """Once both hosts' ranks listen: the outsider container attacks every listener, ends; then the ranks go."""
    try:
        deadline = time.monotonic() + 120
        found: dict[str, set[int]] = {}
        while time.monotonic() < deadline:
            found = {host: listening(client.containers.get(host)) for host in hosts}
            if all(ports & set(BTL) for ports in found.values()):
                break
            time.sleep(0.3)
        else:
            state["error"] = f"the ranks' listeners never appeared: {found}"
            return
        address = {host: client.containers.get(host).attrs["NetworkSettings"]["Networks"][job_id]["IPAddress"]
                   for host in hosts}
        targets = [[address[host], port, f"{host} {port}"] for host in hosts for port in sorted(found[host])]
        (workdir / "targets.json").write_text(json.dumps(targets))
        outsider = client.containers.run(
            IMAGE, entrypoint=["python", "/fixtures/port_outsider.py", "/w/targets.json", "/w/ports.json", "3"],
            command=[], network=job_id, detach=True, name=f"outsider-{job_id[-12:]}",
            labels={LABEL_JOB: job_id},  # removed with the job's containers should the job end first
            mounts=[{"Type": "bind", "Source": str(FIXTURES), "Target": "/fixtures", "ReadOnly": True},
                    {"Type": "bind", "Source": str(workdir), "Target": "/w", "ReadOnly": False}])
        try:
            state["outsider"] = outsider.wait(timeout=60)
        finally:
            outsider.remove(force=True)
        time.sleep(1.0)  # what the runtime or the BTL read has had time to do its harm
    except Exception as exc:  # the job ended under the attack: its containers are gone
        state["interrupted"] = repr(exc)
    finally:
        for host in hosts:
            (host_opt_ml(workdir / "work", host) / "go").write_text("go")


@pytest.mark.parametrize("shim", ["on", "off"])
def test_an_outsider_container_on_the_jobs_network_reaches_no_open_mpi_process(tmp_path, client, shim):
    src = source_dir(tmp_path, "hold_until.py")
    values = hps("hold_until.py", src, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=1,
                 until="/opt/ml/go")
    values["sagemaker_submit_directory"] = json.dumps(CODE_DIR)
    job = LocalJob(hosts=host_names(2), hyperparameters=values,
                   env={"TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TRAINING_TOOLKIT_NETSHIM": shim})
    job_id, state, out = new_job_id(), {}, io.BytesIO()

    def on_start(_containers) -> None:
        threading.Thread(target=attack, args=(client, job_id, job.hosts, tmp_path, state), daemon=True).start()

    result = run_containers(job, tmp_path / "work", environ=os.environ, image=IMAGE, source=src, out=out, client=client, job_id=job_id,
                            timeout_s=240, on_start=on_start)
    text = out.getvalue().decode(errors="replace")
    assert result.leftovers == () and engine.leftovers(client, job_id) == []
    assert "error" not in state, (state["error"], text[-3000:])
    assert "cannot attach a socket filter" in text, text[-3000:]  # no CAP_NET_ADMIN: the guard only cuts
    complaints = [line for line in text.splitlines()
                  if (any(word in line for word in COMPLAINTS) or OPEN_MPI_LINE.search(line)) and "netshim" not in line and "listener guard" not in line]
    print(f"shim {shim}: exit codes {[r.exit_code for r in result.results]}; {len(complaints)} complaints")
    print("\n".join(complaints[:20]))
    if shim == "off":
        assert complaints, text[-3000:]  # e.g. "tcp_peer_recv_connect_ack: invalid header type: 171" from mpirun
        return
    assert "interrupted" not in state, state
    assert [r.exit_code for r in result.results] == [0, 0], text[-3000:]
    tried = json.loads((tmp_path / "ports.json").read_text())
    assert len(tried) > 4, tried
    assert complaints == [], complaints
    assert "training-toolkit netshim: closed a connection from " in text, text[-3000:]
