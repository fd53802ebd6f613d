"""This host's ssh for an MPI job: its keys, its sshd (every host but the first), the first host's client side.

Keys: the first host makes the job's client key, every other host its own host key, each from
the OS's random generator (or all read from mounted keys); the public halves travel in the
channel's introductions.  A worker writes its sshd files once it knows the client key (after
joining) and starts sshd, spares included (a spare may be seated at a later attempt); the first
host pins the workers' host keys once every host has joined (after the barrier), and again for a
host that joined anew with a new key.  sshd admits the job's client key from the addresses it is
given: the attempt's active hosts (``allow``), rewritten before each attempt's ranks can start.
Not used through Slurm (no ssh at all).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from training_toolkit.cluster import netaddr, ssh
from training_toolkit.errors import ClusterError
from training_toolkit.log import log
from training_toolkit.runspec import Seating
from training_toolkit.settings import Settings
from training_toolkit.supervise.deadman import Deadman

INTRO_CLIENT_KEY = "ssh_client_key"  # what the first host introduces: the public half of the job's client key
INTRO_HOST_KEY = "ssh_host_key"  # what every other host introduces: the public half of its own host key


class SshPart:
    """What this host holds of the job's ssh; ``close`` ends sshd and removes the directory."""

    def __init__(self, host: str, is_master: bool, settings: Settings):
        self.host = host
        self.is_master = is_master
        self.settings = settings
        self.port = settings.ssh_port
        self.layout: ssh.SshLayout | None = None
        self.sshd: ssh.Sshd | None = None
        self._keys: ssh.KeyPair | None = None  # the client key on the first host, this host's host key elsewhere
        self._client_public = ""  # a worker: the job's client key, as the first host introduced it
        self._allowed: tuple[str, ...] = ()  # a worker: the addresses sshd admits the client key from, now
        self._ssh_dir: Path | None = None  # removed with everything in it when the job ends
        self._pinned: dict[str, str] = {}  # the first host: each worker's ssh host key, as pinned
        self._tripwire: Deadman | None = None  # removes it, and ends sshd and its sessions, should train be killed

    def _new_ssh_dir(self) -> Path:
        self._ssh_dir = ssh.new_ssh_dir()
        self._tripwire = Deadman(directories=[self._ssh_dir])  # sshd and ssh's shared connections: watch_for, environment_for
        return self._ssh_dir

    def introduction(self) -> dict[str, str]:
        keys_dir = self.settings.ssh_keys
        mounted = ssh.load_keys(keys_dir) if keys_dir else None
        if self.is_master:
            self._keys = mounted.client if mounted else ssh.generate_keypair(f"training-toolkit-client@{self.host}")
            return {INTRO_CLIENT_KEY: self._keys.public}
        self._keys = mounted.host if mounted else ssh.generate_keypair(f"training-toolkit-host@{self.host}")
        return {INTRO_HOST_KEY: self._keys.public}

    def serve(self, seat: Seating, allowed_from: Sequence[str], session_env: Mapping[str, str]) -> None:
        """A worker: write the server side (the client key admitted from ``allowed_from`` only) and start sshd."""
        assert self._keys is not None and not self.is_master
        master = seat.ctx.plan.hosts[0]
        self._client_public = introduced(seat.introductions or {}, master, INTRO_CLIENT_KEY)
        self._allowed = tuple(allowed_from)
        self.layout = ssh.write_server_side(
            self._new_ssh_dir(), host_key=self._keys, client_public=self._client_public, port=self.port,
            allowed_from=self._allowed, user=_user(),
            listen_addresses=listen_addresses(seat.ctx.job.resource.network_interface_name, self.host),
            session_env=session_env)
        self.sshd = ssh.Sshd(self.layout, sshd_path=self.settings.sshd)
        self.sshd.start()

    def allow(self, allowed_from: Sequence[str]) -> None:
        """A worker: sshd admits the client key from these addresses from the next login on (an attempt's hosts)."""
        allowed = tuple(allowed_from)
        if self.layout is None or self.is_master or allowed == self._allowed:
            return
        ssh.allow_from(self.layout, self._client_public, allowed)
        self._allowed = allowed

    def connect(self, seat: Seating, workers: Sequence[str]) -> None:
        """The first host, after barrier 0: its client side with every worker's host key pinned; ``workers`` answer."""
        assert self._keys is not None and self.is_master
        self._pinned = host_keys(seat)
        self.layout = ssh.write_client_side(self._new_ssh_dir(), client_key=self._keys, host_keys=self._pinned,
                                            port=self.port)
        ssh.wait_for_ssh(self.layout, list(workers), deadline_s=min(60.0, seat.join_timeout_s))

    def repin(self, seat: Seating) -> None:
        """The first host, after a restart's barrier: a host whose ``train`` restarted rejoined with a new key."""
        assert self.layout is not None and self._keys is not None
        keys = host_keys(seat)
        if keys == self._pinned:
            return
        changed = sorted(host for host in keys if keys[host] != self._pinned.get(host))
        log(f"{self.host}: new ssh host key(s) of {', '.join(changed)}, which joined again: pinned")
        ssh.end_connections(self.layout)  # shared connections to an sshd that is gone
        self._pinned = keys
        ssh.repin_host_keys(self.layout, keys, port=self.port)
        ssh.wait_for_ssh(self.layout, changed, deadline_s=min(60.0, seat.join_timeout_s))

    def close(self) -> None:
        if self.layout is not None and self.is_master:
            ssh.end_connections(self.layout)
        if self.sshd is not None:
            self.sshd.stop()
        if self._ssh_dir is not None:
            shutil.rmtree(self._ssh_dir, ignore_errors=True)
        if self._tripwire is not None:
            self._tripwire.disarm()


def host_keys(seat: Seating) -> dict[str, str]:
    """Every worker's introduced host key (the job's every host but the first: spares included)."""
    introductions = seat.introductions or {}
    return {host: introduced(introductions, host, INTRO_HOST_KEY) for host in seat.ctx.plan.hosts[1:]}


def introduced(introductions, host: str, key: str) -> str:
    """A public key another host introduced, checked; a ClusterError naming the host if it did not."""
    line = introductions.get(host, {}).get(key)
    if not line:
        raise ClusterError(f"{host} did not introduce its {key.replace('_', ' ')} (a host of another toolkit version?)")
    return ssh.keys.check_public_line(line, f"{key.replace('_', ' ')} of {host}")


def listen_addresses(interface: str, host: str) -> list[str]:
    """Where this host's sshd listens: its address on the job's interface, else what its name resolves to."""
    address = netaddr.interface_ipv4(interface)
    if address:
        return [address]
    return sorted(a for a in netaddr.resolve(host) if not netaddr.is_loopback(a))


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name
