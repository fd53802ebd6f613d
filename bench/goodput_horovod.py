"""The goodput benchmark's Horovod elastic run: horovodrun on algo-1, sshd on every host, a discovery script.

The job's ssh files are made for the run by the toolkit's own code (``WRITE_SSH_DIR``: pinned host keys,
a per-run client key) in each host's ``/run``; horovodrun finds ``ssh`` first on its ``PATH`` as a
wrapper that adds ``-F`` with that config.  The discovery script prints the hosts up (``host:1``), as a
platform's would: a killed host leaves the list before its kill, and comes back to it once its sshd
(started again in the same host, as a replacement node's would be) is up.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from common import PYTHON, WAIT_FOR_SSH, WRITE_SSH_DIR
from goodput_jobs import H4, HOROVOD_JOB, TAGS, Faults, Outcome, job_env, running, timed

from training_toolkit.local.launcher import INTERFACE
from training_toolkit.local.netns import NamespaceCluster

SSH_DIR = "/run/bench-goodput-ssh"
SCRIPT = "goodput_hvd.py"


def _ssh_files(cluster: NamespaceCluster, env: dict[str, str]) -> None:
    from training_toolkit.cluster.ssh.keys import generate_keypair
    client, host_key = generate_keypair("bench-client"), generate_keypair("bench-host")
    keys = Path(tempfile.mkdtemp(prefix="bench-goodput-keys-")) / "keys.json"
    keys.write_text(json.dumps({"client": [client.private.decode(), client.public],
                                "host": [host_key.private.decode(), host_key.public]}))
    try:
        names, addresses = [h.name for h in cluster.hosts], [h.address for h in cluster.hosts]
        for host in cluster.hosts:
            for side, rest in (("client", names), ("server", addresses)):
                cluster.run(host, [str(PYTHON), "-c", WRITE_SSH_DIR, str(keys), f"{SSH_DIR}-{side}", side, *rest],
                            env=env, timeout=60, check=True)
    finally:
        keys.unlink()
        keys.parent.rmdir()


def horovod(tmp: Path, plan, args) -> Outcome:
    label = "horovodrun elastic --min-np 2 (TensorFlow)"
    shared, bin_dir = tmp / "shared", tmp / "bin"
    shared.mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {SSH_DIR}-client/ssh_config "$@"\n')
    up_file = tmp / "hosts-up"
    (bin_dir / "discover.sh").write_text(f"#!/bin/sh\ncat {up_file}\n")
    for f in ("ssh", "discover.sh"):
        (bin_dir / f).chmod(0o755)
    base = {"PATH": f"{bin_dir}:{Path(PYTHON).parent}:/usr/bin:/bin", "LANG": "C.UTF-8",
            "HOME": os.environ.get("HOME", "/root")}
    env = {**base, "TF_CPP_MIN_LOG_LEVEL": "3", **job_env(shared, args)}
    up = set(H4)

    def write_up() -> None:
        (up_file.parent / "hosts-up.tmp").write_text("".join(f"{h}:1\n" for h in sorted(up)))
        os.replace(up_file.parent / "hosts-up.tmp", up_file)

    back_s = 15 * args.scale
    cmd = [str(Path(PYTHON).with_name("horovodrun")), "-np", "4", "--min-np", "2", "--max-np", "4",
           "--host-discovery-script", str(bin_dir / "discover.sh"), "--gloo", "--network-interface", INTERFACE,
           # a failing host is blacklisted for good by default: the replacement reuses its name here
           "--blacklist-cooldown-range", f"{max(1, int(back_s / 2))}", f"{max(2, int(back_s))}",
           # --elastic-timeout not its 600 s: a hang ends in bounded time
           "--start-timeout", "120", "--elastic-timeout", "120", str(PYTHON), f"/opt/ml/code/{SCRIPT}"]
    from helpers.deadhost import HostKiller

    with NamespaceCluster(H4, tmp / "cluster") as cluster:
        killer = HostKiller()
        killer.before_start(cluster)
        TAGS.append(cluster.tag)
        for host in cluster.hosts:
            (host.opt_ml / "code").mkdir(parents=True, exist_ok=True)
            (host.opt_ml / "code" / SCRIPT).write_text(HOROVOD_JOB)
        _ssh_files(cluster, base)

        def sshd(name: str) -> None:
            cluster.popen(name, ["/usr/sbin/sshd", "-D", "-e", "-f", f"{SSH_DIR}-server/sshd_config"],
                          env={"PATH": base["PATH"]}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)

        def answering(*names: str) -> None:  # every named host's sshd takes the job's key
            cluster.run("algo-1", [str(PYTHON), "-c", WAIT_FOR_SSH, f"{SSH_DIR}-client", *names],
                        env=base, timeout=60, check=True)

        for name in H4:
            sshd(name)
        answering(*H4)
        write_up()

        def kill(name: str) -> None:
            up.discard(name)
            write_up()
            killer.kill(name)

        def back(name: str) -> None:
            sshd(name)
            answering(name)
            up.add(name)
            write_up()

        faults = Faults(plan, "algo-1", running=lambda: running(cluster, SCRIPT), kill=kill, back=back, shared=shared)
        with open(tmp / "horovodrun.log", "wb") as log:
            t0 = time.monotonic()
            proc = cluster.popen("algo-1", cmd, env=env, cwd="/opt/ml/code", stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
            faults.start(H4)
            try:
                code = proc.wait(timeout=600 + 4 * args.steps * args.step_s)
            except subprocess.TimeoutExpired:
                code = None
            wall = time.monotonic() - t0
            faults.stop()
            for name in H4:
                killer.kill(name)
    if code != 0 or not (shared / "done").exists() or faults.errors:
        tail = (tmp / "horovodrun.log").read_text(errors="replace").splitlines()[-15:]
        return Outcome(label, None, f"failed: exit {code} {faults.errors}: " + " | ".join(tail)[-600:], faults.kills)
    return timed(Outcome(label, wall, "", faults.kills), shared)
