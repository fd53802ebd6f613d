"""Slurm's accounting for a local Slurm cluster: a MariaDB server and slurmdbd on the first host, so sacct answers.

``sacct`` reads what slurmdbd stored, and slurmdbd stores it in MySQL/MariaDB: without both, a
test could not check that Slurm recorded a step as failed.  Both run in the foreground in the first
host (its own ``/run`` holds the database's socket, reachable by nothing outside the host; the
database takes no network connection), their files under the cluster's directory; they end with the
hosts like the other daemons.  Root connects through the socket (unix_socket authentication): no
password exists anywhere.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from training_toolkit.core.errors import ClusterError
from training_toolkit.local.slurm_conf import CLUSTER_NAME

DBD_PORT = 6819
SOCKET = "/run/mysqld/mysqld.sock"
TMP = "/run/mysqld-tmp"  # the database's temporary files, in the host's own /run
TOOLS = (("mariadbd", "mariadb-server"), ("mariadb-install-db", "mariadb-server"), ("slurmdbd", "slurmdbd"),
         ("sacct", "slurm-client"))


def missing_tools(path: str) -> list[str]:
    return [f"{tool} ({package})" for tool, package in TOOLS if shutil.which(tool, path=path) is None]


def slurmdbd_conf(host: str, address: str, log: Path) -> str:
    """slurmdbd.conf (pure): slurmdbd on ``host``, storing in the local database through its socket."""
    return "\n".join([
        "AuthType=auth/munge", f"DbdHost={host}", f"DbdAddr={address}", f"DbdPort={DBD_PORT}", "SlurmUser=root",
        "StorageType=accounting_storage/mysql", "StorageHost=localhost", "StorageUser=root", "StorageLoc=slurm_acct_db", f"LogFile={log}", "PidFile=/run/slurmdbd.pid", "",
    ])


def start(slurm, timeout_s: float = 90.0) -> None:
    """Database, slurmdbd, this cluster registered; ClusterError naming the step that did not come up."""
    missing = missing_tools(slurm.env()["PATH"])
    if missing:
        raise ClusterError(f"Slurm accounting needs {', '.join(missing)} (scripts/setup.sh installs them)")
    first = slurm.cluster.hosts[0]
    data = slurm.workdir / "db"
    # its temporary files in the host's own /run: in the machine's /tmp, two clusters' databases (each in a PID
    # namespace of its own, so with the same small pids) made files of the same name and one failed to install
    install = slurm.run(["sh", "-c", f'mkdir -m 0700 -p {TMP} && TMPDIR={TMP} exec "$@"', "mariadb-install-db",
                         "mariadb-install-db", f"--datadir={data}", "--user=root", "--skip-test-db",
                         "--auth-root-authentication-method=socket"], host=first.name, timeout=timeout_s)
    if install.returncode != 0:
        raise ClusterError(f"mariadb-install-db failed: {install.stderr.strip()[-500:]}")
    slurm.start_daemon(first.name, "mariadbd", [
        "sh", "-c", 'mkdir -m 0755 -p /run/mysqld && exec "$@"', "mariadbd", "mariadbd", "--no-defaults",
        f"--datadir={data}", "--user=root", "--skip-networking", f"--socket={SOCKET}",
        f"--tmpdir={TMP}",  # the install made it, in this host's /run
        f"--log-error={slurm.logs / 'mariadb.err'}"])
    _until(slurm, ["mariadb", "--no-defaults", f"--socket={SOCKET}", "-e", "select 1"], first.name, timeout_s,
           "the database")
    conf = slurm.conf.with_name("slurmdbd.conf")  # slurmdbd reads it next to SLURM_CONF
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # slurmdbd refuses a readable one
    with os.fdopen(fd, "w") as f:
        f.write(slurmdbd_conf(first.name, first.address, slurm.logs / "slurmdbd.log"))
    slurm.start_daemon(first.name, "slurmdbd", ["slurmdbd", "-D"])
    _until(slurm, ["sacctmgr", "-n", "list", "cluster"], first.name, timeout_s, "slurmdbd")
    added = slurm.run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], host=first.name, timeout=60)
    if added.returncode != 0 and "already exists" not in added.stdout + added.stderr:
        raise ClusterError(f"sacctmgr add cluster failed: {(added.stdout + added.stderr).strip()}")


def _until(slurm, argv: list[str], host: str, timeout_s: float, what: str) -> None:
    slurm.until_answers(argv, host, time.monotonic() + timeout_s, what, slurm.logs)