"""A real Slurm cluster on local namespace hosts: munged, slurmctld and one slurmd per host, and its teardown.

Every Slurm claim of the toolkit (``srun train`` makes a job of the allocation's nodes, ``scancel``
is a stop with the grace, a failing rank fails the step) is tested against the real daemons of
Debian's Slurm, not a simulation: one ``munged`` per host (each host has its own ``/run``, where
the socket lives) sharing one random key made for this cluster alone, ``slurmctld`` on the first
host, and a ``slurmd`` on every host whose ``NodeName`` is the host's name.  With ``head``, one more host runs
``slurmctld`` (and accounting) and is no node, as a real cluster's head node: the nodes, the batch host among
them, can then die without the controller, and client commands run there by default.  The daemons run in
the foreground as children of the hosts, so ``close`` ends them with the hosts (nothing is left:
no process, namespace or key).  Client commands (``srun``, ``sbatch``, ``scancel``, ``sinfo``) run
inside a host with ``SLURM_CONF`` pointing at this cluster's configuration.

``python -m training_toolkit.local.slurm --nodes 2 -- srun -N2 hostname`` runs one command on a
fresh cluster and tears it down (``scripts/slurm-local.sh``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from training_toolkit.core.errors import ClusterError
from training_toolkit.local.netns import NamespaceCluster
from training_toolkit.local.slurm_conf import slurm_conf
from training_toolkit.core.log import log

DAEMONS = (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("srun", "slurm-client"))
READY_TIMEOUT_S = 90.0
#: What commands inside a host get: a PATH with the system's tools (the hosts share the file system).
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def missing_tools() -> list[str]:
    """The Slurm and munge programs this machine lacks, with their Debian package; empty when all are there."""
    return [f"{tool} ({package})" for tool, package in DAEMONS if shutil.which(tool, path=BASE_ENV["PATH"]) is None]


class SlurmCluster:
    """A started NamespaceCluster running a real Slurm; a context manager, like the cluster it wraps.

    ``workdir`` holds the configuration, the daemons' state and logs (kept after close, for a
    failed test to show) and each host's ``/opt/ml``; the munge key is removed at close.
    """

    def __init__(self, names: Sequence[str], workdir: Path, *, cpus: int = 4, kill_wait_s: int = 30,
                 slurmd_timeout_s: int = 60, tag: str | None = None, accounting: bool = False,
                 head: str | None = None) -> None:
        self.workdir = Path(workdir).absolute()
        self.head = head  # the controller's host, no node (None: the first node is the controller's)
        self.cluster = NamespaceCluster([*([head] if head else []), *names], self.workdir / "hosts", tag=tag)
        self._cpus = cpus
        self._kill_wait_s = kill_wait_s
        self._slurmd_timeout_s = slurmd_timeout_s  # a dead node is marked DOWN this long after its last answer
        self.accounting = accounting  # slurmdbd and its database, so that sacct answers (slurm_accounting)
        self.conf = self.workdir / "slurm.conf"
        self.logs = self.workdir / "log"
        self.jobcomp = self.workdir / "jobcomp.txt"
        self._key = self.workdir / "munge" / "munge.key"
        self._daemons: list[tuple[str, subprocess.Popen[Any]]] = []

    @property
    def names(self) -> tuple[str, ...]:
        """The nodes (the head host is none)."""
        return tuple(h.name for h in self.cluster.hosts if h.name != self.head)

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Hosts, munge, slurmctld, slurmd; returns once every node is idle.  ClusterError after a full teardown."""
        missing = missing_tools()
        if missing:
            raise ClusterError(f"Slurm is not installed: missing {', '.join(missing)} (scripts/setup.sh installs it)")
        self.cluster.start()
        try:
            self._write_files()
            for host in self.cluster.hosts:
                # /run is the host's own, empty tmpfs: munged's socket directory is made there first.
                self.start_daemon(host.name, "munged", [
                    "sh", "-c", 'mkdir -m 0755 -p /run/munge && exec "$@"', "munged",
                    "munged", "-F", "--force", f"--key-file={self._key}",
                    f"--log-file={self.logs / f'munged-{host.name}.log'}",
                    f"--seed-file={self.workdir / 'munge' / f'{host.name}.seed'}"])
            self._wait_for_munge()
            if self.accounting:
                from training_toolkit.local import slurm_accounting

                slurm_accounting.start(self)
            first = self.cluster.hosts[0].name  # the head host where there is one
            self.start_daemon(first, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf),
                                              "-L", str(self.logs / "slurmctld.log")])
            for name in self.names:
                self.start_daemon(name, "slurmd", ["slurmd", "-D", "-f", str(self.conf),
                                              "-L", str(self.logs / f"slurmd-{name}.log")])
            self._wait_for_idle()
        except BaseException:
            self.close()
            raise

    def _write_files(self) -> None:
        for directory in (self.workdir / "ctld", self.logs):
            directory.mkdir(parents=True, exist_ok=True)
        self._key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self._key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))  # one random key per cluster: no two clusters trust each other
        nodes = [(h.name, h.address) for h in self.cluster.hosts if h.name != self.head]
        head = [(h.name, h.address) for h in self.cluster.hosts if h.name == self.head]
        self.conf.write_text(slurm_conf(nodes, self.workdir, cpus=self._cpus, kill_wait_s=self._kill_wait_s,
                                        slurmd_timeout_s=self._slurmd_timeout_s, jobcomp=self.jobcomp,
                                        accounting=self.accounting, controller=head[0] if head else None))

    def start_daemon(self, host: str, name: str, argv: list[str]) -> None:
        """A daemon in the foreground inside ``host``, its output in ``log/NAME-HOST.out``; it ends with the host."""
        out = open(self.logs / f"{name}-{host}.out", "ab")
        with out:
            proc = self.cluster.popen(host, argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT)
        self._daemons.append((f"{name} on {host}", proc))

    def check_daemons(self) -> None:
        """A daemon that ended while the cluster starts is named at once, with its output's last lines."""
        for label, proc in self._daemons:
            if proc.poll() is not None:
                name, _, host = label.partition(" on ")
                out = self.logs / f"{name}-{host}.out"
                tail = " | ".join(out.read_text(errors="replace").strip().splitlines()[-3:]) if out.exists() else ""
                raise ClusterError(f"{label} exited with {proc.returncode}: {tail} (logs in {self.logs})")

    def _wait_for_munge(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for host in self.cluster.hosts:
            self.until_answers(["sh", "-c", "munge -n | unmunge"], host.name, deadline, f"munged on {host.name}",
                               self.logs / f"munged-{host.name}.log")

    def until_answers(self, argv: Sequence[str], host: str, deadline: float, what: str, log: Path) -> None:
        """Run ``argv`` in ``host`` until it succeeds; a daemon's death or ``deadline`` ends the wait, named."""
        while True:
            probe = self.run(argv, host=host, timeout=20)
            if probe.returncode == 0:
                return
            self.check_daemons()
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} never answered: {probe.stderr.strip()[-300:]} (log: {log})")
            time.sleep(0.2)

    def _wait_for_idle(self) -> None:
        """Until sinfo shows every node idle; names the nodes that are not, with the daemons' logs."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            probe = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30)
            if probe.returncode == 0:
                states = dict(line.split(None, 1) for line in probe.stdout.splitlines() if " " in line)
                if set(states) == set(self.names) and all(s.startswith("idle") for s in states.values()):
                    return
            self.check_daemons()
            time.sleep(0.3)
        raise ClusterError(f"Slurm nodes not idle within {READY_TIMEOUT_S:g} s: {states or 'no answer from slurmctld'}"
                           f" (logs in {self.logs})")

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**BASE_ENV, "SLURM_CONF": str(self.conf), **(extra or {})}

    def run(self, argv: Sequence[str], *, host: str | None = None, timeout: float = 60,
            env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (or any) inside ``host`` (the head host, else the first node, by default), its output
        captured as text."""
        kwargs.setdefault("capture_output", True)
        return self.cluster.run(host or self.cluster.hosts[0].name, list(argv), timeout=timeout, env=self.env(env),
                                text=True, **kwargs)

    def popen(self, argv: Sequence[str], *, host: str | None = None, env: Mapping[str, str] | None = None,
              **kwargs: Any) -> subprocess.Popen[Any]:
        return self.cluster.popen(host or self.cluster.hosts[0].name, list(argv), env=self.env(env), **kwargs)

    def leftovers(self) -> list[str]:
        found = self.cluster.leftovers()
        if self._key.exists():
            found.append(f"munge key {self._key}")
        return found

    def close(self) -> None:
        """End every daemon and job with the hosts, and remove the key; never raises."""
        self.cluster.close()
        try:
            self._key.unlink(missing_ok=True)
        except OSError as exc:
            log(f"slurm cluster: cannot remove the munge key {self._key}: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training_toolkit.local.slurm",
                                     description="Run one command on a fresh local Slurm cluster, then tear it down.")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="kept afterwards (default: a temporary one)")
    parser.add_argument("--kill-wait", type=int, default=30, help="slurm.conf KillWait, seconds")
    parser.add_argument("--accounting", action="store_true", help="slurmdbd and its database too, for sacct")
    parser.add_argument("command", nargs="+", help="run in the first node with SLURM_CONF set")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tt-slurm-"))
    names = [f"node{i}" for i in range(1, args.nodes + 1)]
    with SlurmCluster(names, workdir, kill_wait_s=args.kill_wait, accounting=args.accounting) as slurm:
        proc = slurm.popen(args.command, cwd=str(workdir))
        code = proc.wait()
    left = slurm.leftovers()
    if left:
        print(f"left behind: {left}", file=sys.stderr)
        return 70
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
