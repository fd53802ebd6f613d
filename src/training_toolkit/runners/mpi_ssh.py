"""This host's ssh for an MPI job: its keys, its sshd (every host but the first), its client side (every host).

Open MPI launches its daemons as a tree (tree spawn): mpirun logs in to its children, each daemon to
its own, so every host logs in to others.  Keys: every host makes its own client key, and every host
but the first its own host key, each from the OS's random generator (or all read from mounted keys);
only public halves travel, in the channel's introductions: each host's in its join, every host's in
the first host's go.  A worker writes its sshd files and starts sshd once it has joined (spares
included), admitting nobody yet; after each go it writes its client side (its client key, every
worker's host key pinned) and then admits the client keys of the hosts that launch there (the lead,
and its parent in the launch tree, ``mpi_tree``), each from that host's addresses only (a spare
admits nobody).  The first host pins the workers' host keys
after the barrier and, before mpirun, probes each of the attempt's workers: a login succeeds only once
that worker has written its files for the attempt, so when the probe is through, every host is ready
for whichever logins the tree gives it.  Before a restart's barrier a worker admits nobody again; the
first host ends its shared connections then, and probes again (a host whose ``train`` restarted
rejoined with new keys, pinned anew).  Not used through Slurm (no ssh at all).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from training_toolkit import rundir
from training_toolkit.cluster import netaddr
from training_toolkit.cluster.ssh.keys import KeyPair, check_public_line, generate_keypair, load_keys
from training_toolkit.cluster.ssh.layout import (SshLayout, admit, end_connections, new_ssh_dir, repin_host_keys,
                                                  write_client_side, write_server_side)
from training_toolkit.cluster.ssh.probe import wait_for_ssh
from training_toolkit.cluster.ssh.sshd import Sshd
from training_toolkit.errors import ClusterError
from training_toolkit.log import log
from training_toolkit.runners.mpi_launch import mpi_options
from training_toolkit.runners.mpi_tree import launcher, routed_radix
from training_toolkit.runspec import Seating
from training_toolkit.settings import SSH_CONFIG_VAR, Settings
from training_toolkit.supervise.deadman import Deadman

INTRO_CLIENT_KEY = "ssh_client_key"  # what every host introduces: the public half of its own client key
INTRO_HOST_KEY = "ssh_host_key"  # what every host but the first introduces: the public half of its own host key


class SshPart:
    """What this host holds of the job's ssh; ``close`` ends sshd and removes the directory."""

    def __init__(self, host: str, is_lead: bool, settings: Settings, environ: Mapping[str, str]):
        self.host = host
        self.environ = environ  # the toolkit's, as read at its start: where the directory goes, what ssh runs with
        self.is_lead = is_lead
        self.settings = settings
        self.port = settings.ssh_port
        self.layout: SshLayout | None = None
        self.sshd: Sshd | None = None
        self._client: KeyPair | None = None  # this host's client key
        self._host_key: KeyPair | None = None  # a worker: its host key
        self._addresses: Mapping[str, Sequence[str]] = {}  # a worker: each job host's addresses (its key's from=)
        self._trusted: tuple = ()  # a worker: the keys its files were last written for
        self._ssh_dir: Path | None = None  # removed with everything in it when the job ends
        self._pinned: dict[str, str] = {}  # the first host: each worker's ssh host key, as pinned
        self._tripwire: Deadman | None = None  # removes it, and ends sshd and its sessions, should train be killed

    def _new_ssh_dir(self) -> Path:
        self._ssh_dir = new_ssh_dir(rundir.parent(self.environ))
        self._tripwire = Deadman(directories=[self._ssh_dir])  # sshd and ssh's shared connections: watch_for, environment_for
        return self._ssh_dir

    def introduction(self) -> dict[str, str]:
        keys_dir = self.settings.ssh_keys
        mounted = load_keys(keys_dir) if keys_dir else None
        self._client = mounted.client if mounted else generate_keypair(f"training-toolkit-client@{self.host}")
        if self.is_lead:
            return {INTRO_CLIENT_KEY: self._client.public}
        self._host_key = mounted.host if mounted else generate_keypair(f"training-toolkit-host@{self.host}")
        return {INTRO_CLIENT_KEY: self._client.public, INTRO_HOST_KEY: self._host_key.public}

    def agent_environment(self) -> dict[str, str]:
        """What this host's logins need (mpirun's environment, sshd's sessions): where its ssh config is."""
        assert self.layout is not None
        return {SSH_CONFIG_VAR: str(self.layout.ssh_config)}

    def serve(self, seat: Seating, addresses: Mapping[str, Sequence[str]], session_env: Mapping[str, str]) -> None:
        """A worker: write the server side, admitting nobody yet (``trust``, after the go), and start sshd.

        ``addresses``: each job host's addresses, from which its client key alone is admitted.
        """
        assert self._host_key is not None and not self.is_lead
        self._addresses = dict(addresses)
        directory = self._new_ssh_dir()
        layout = SshLayout(directory, self.port)  # the sessions' variable names the client side written later
        self.layout = write_server_side(
            directory, host_key=self._host_key, authorized=(), port=self.port, user=_user(),
            listen_addresses=listen_addresses(seat.ctx.job.resource.network_interface_name, self.host),
            session_env={**session_env, SSH_CONFIG_VAR: str(layout.ssh_config)})
        self.sshd = Sshd(self.layout, sshd_path=self.settings.sshd)
        self.sshd.start()

    def trust(self, seat: Seating) -> None:
        """A worker, after a go: its client side (every worker's host key pinned), then the client keys of the hosts
        that launch something here admitted: the lead's (its probe, and mpirun's login below ``routed_radix + 2``
        hosts) and that of the daemon that starts this host's in the launch tree (``mpi_tree.launcher``), each from
        its own addresses.  No other host's key gets in: an address taken over yields a login only where that
        host launches (docs/security.md).

        In that order: the lead's probe gets in only once both are written.  Written again only when a
        host's keys changed (one that rejoined), or after ``shut`` (a restart).
        """
        assert self.layout is not None and self._client is not None and not self.is_lead
        hosts = seat.ctx.plan.hosts
        introductions = seat.introductions or {}
        radix = routed_radix(mpi_options(seat.ctx).custom.mpirun_args)
        launchers = dict.fromkeys((hosts[0], launcher(hosts, self.host, radix)))  # the lead first, once
        clients = tuple((introduced(introductions, host, INTRO_CLIENT_KEY), tuple(self._addresses[host]))
                        for host in launchers)
        pinned = {host: introduced(introductions, host, INTRO_HOST_KEY) for host in hosts[1:]}
        if (clients, pinned) == self._trusted:
            return
        write_client_side(self.layout.directory, client_key=self._client, host_keys=pinned, port=self.port,
                          shared_connections=False)
        admit(self.layout, clients)
        self._trusted = (clients, pinned)

    def shut(self) -> None:
        """A worker, before a restart's barrier: admit nobody until the next go's keys are written (``trust``)."""
        if self.layout is not None and not self.is_lead:
            admit(self.layout, ())
            self._trusted = ()

    def connect(self, seat: Seating) -> None:
        """The first host, after barrier 0: its client side with every worker's host key pinned (spares included)."""
        assert self._client is not None and self.is_lead
        self._pinned = host_keys(seat)
        self.layout = write_client_side(self._new_ssh_dir(), client_key=self._client, host_keys=self._pinned,
                                        port=self.port)

    def probe(self, seat: Seating, workers: Sequence[str]) -> None:
        """The first host, before mpirun: each of the attempt's ``workers`` lets it in, which it does only once it has
        written the go's keys (``trust``): then every host is ready for whichever logins the tree gives it."""
        assert self.layout is not None and self.is_lead
        wait_for_ssh(self.layout, list(workers), deadline_s=min(60.0, seat.join_timeout_s),
                     environ=self.environ)

    def repin(self, seat: Seating) -> None:
        """The first host, after a restart's barrier: new keys of a host that rejoined pinned; its connections ended."""
        assert self.layout is not None and self._client is not None
        keys = host_keys(seat)
        if keys != self._pinned:
            changed = sorted(host for host in keys if keys[host] != self._pinned.get(host))
            log(f"{self.host}: new ssh host key(s) of {', '.join(changed)}, which joined again: pinned")
            self._pinned = keys
            repin_host_keys(self.layout, keys, port=self.port)
        # every worker admits nobody from before this barrier until it has the go's keys: a shared connection
        # would skip that in the probe (and one to an sshd that is gone is of no use)
        end_connections(self.layout)

    def close(self) -> None:
        if self.layout is not None and self.is_lead:
            end_connections(self.layout)
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
    return check_public_line(line, f"{key.replace('_', ' ')} of {host}")


def listen_addresses(interface: str, host: str) -> list[str]:
    """Where this host's sshd listens: its address on the job's interface, else what its name resolves to."""
    address = netaddr.interface_ipv4(interface)
    if address:
        return [address]
    return sorted(a for a in netaddr.resolve(host) if not netaddr.is_loopback(a))


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name
