"""This host's ssh for an MPI job: its keys, its sshd (every host that does not lead), its client side (every host).

Open MPI launches its daemons as a tree (tree spawn): mpirun logs in to its children, each daemon to
its own, so every host logs in to others.  Keys: every host makes its own client key and its own host
key, each from the OS's random generator (or all read from mounted keys); only public halves travel,
in the channel's introductions: each host's in its join, every host's in the lead's go.  The roles
are the attempt's (any member may lead after a failover, ``agent/succession.py``):

- a host that does not lead an attempt runs sshd (started at its first such attempt, or when it
  prepares; a spare's too, admitting nobody), and after each go writes its client side (every other
  active host's host key pinned) and then admits the client keys of the hosts that launch there (the
  lead, and its parent in the launch tree, ``mpi_tree``), each from that host's addresses only;
- the lead admits nobody, writes its client side (every other active host's host key pinned, with
  shared connections for mpirun's logins) and, before mpirun, probes each of the attempt's other
  hosts: a login succeeds only once that host has written its files for the attempt, so when the
  probe is through, every host is ready for whichever logins the tree gives it.

Once an attempt has ended on a host (before the next attempt's barrier), it admits nobody until the next
go's keys are written; a lead ends its shared connections and pins anew the keys of a host that rejoined.  Not used through Slurm (no ssh).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from training_toolkit.supervise import rundir
from training_toolkit.cluster import netaddr
from training_toolkit.cluster.ssh.keys import KeyPair, check_public_line, generate_keypair, load_keys
from training_toolkit.cluster.ssh.layout import (SshLayout, admit, end_connections, new_ssh_dir,
                                                  write_client_side, write_server_side)
from training_toolkit.cluster.ssh.probe import wait_for_ssh
from training_toolkit.cluster.ssh.sshd import Sshd
from training_toolkit.core.errors import ClusterError
from training_toolkit.core.log import log
from training_toolkit.runners.mpi_launch import mpi_options
from training_toolkit.runners.mpi_tree import launcher, routed_radix
from training_toolkit.runspec import Seating
from training_toolkit.config.settings import SSH_CONFIG_VAR, Settings
from training_toolkit.supervise.deadman import Deadman

INTRO_CLIENT_KEY = "ssh_client_key"  # what every host introduces: the public half of its own client key
INTRO_HOST_KEY = "ssh_host_key"  # what every host introduces: the public half of its own host key (for its sshd)


class SshPart:
    """What this host holds of the job's ssh; ``close`` ends sshd and removes the directory."""

    def __init__(self, host: str, settings: Settings, environ: Mapping[str, str]):
        self.host = host
        self.environ = environ  # the toolkit's, as read at its start: where the directory goes, what ssh runs with
        self.settings = settings
        self.port = settings.ssh_port
        self.layout: SshLayout | None = None
        self.sshd: Sshd | None = None
        self._client: KeyPair | None = None  # this host's client key
        self._host_key: KeyPair | None = None  # this host's host key (its sshd's, should it not lead)
        self._addresses: Mapping[str, Sequence[str]] = {}  # each job host's addresses (its key's from=)
        self._hosts: Sequence[str] = ()  # every host of the job (``prepare``)
        self._interface = ""  # the job's network interface: where sshd listens
        self._session_env: Mapping[str, str] = {}  # what sshd gives its sessions (the daemons mpirun starts here)
        self._written: tuple = ()  # the client side and admitted keys last written (a lead's, a follower's)
        self._ssh_dir: Path | None = None  # removed with everything in it when the job ends
        self._tripwire: Deadman | None = None  # removes it, and ends sshd and its sessions, should train be killed

    def _directory(self) -> Path:
        if self._ssh_dir is None:
            self._ssh_dir = new_ssh_dir(rundir.parent(self.environ))
            # sshd and ssh's shared connections: watch_for, environment_for
            self._tripwire = Deadman(directories=[self._ssh_dir])
            self.layout = SshLayout(self._ssh_dir, self.port)
        return self._ssh_dir

    def introduction(self) -> dict[str, str]:
        """This host's public keys, made (or loaded) at the first call: the same for the whole job, however often a
        host introduces itself (to each lead it joins: ``Membership.introduce``)."""
        if self._client is None or self._host_key is None:
            keys_dir = self.settings.ssh_keys
            mounted = load_keys(keys_dir) if keys_dir else None
            self._client = mounted.client if mounted else generate_keypair(f"training-toolkit-client@{self.host}")
            self._host_key = mounted.host if mounted else generate_keypair(f"training-toolkit-host@{self.host}")
        return {INTRO_CLIENT_KEY: self._client.public, INTRO_HOST_KEY: self._host_key.public}

    def agent_environment(self) -> dict[str, str]:
        """What this host's logins need (mpirun's environment, sshd's sessions): where its ssh config is."""
        assert self.layout is not None
        return {SSH_CONFIG_VAR: str(self.layout.ssh_config)}

    def prepare(self, seat: Seating, session_env: Mapping[str, str],
                addresses: Mapping[str, Sequence[str]] | None) -> None:
        """What sshd needs, kept; sshd started now unless this host leads (``serve``).

        ``addresses``: each job host's addresses, from which its client key alone is admitted (None: resolved when
        sshd starts).
        """
        self._hosts = seat.ctx.plan.hosts
        self._interface = seat.ctx.job.resource.network_interface_name
        self._addresses = dict(addresses or {})
        self._session_env = dict(session_env)
        if not seat.leads:
            self.serve()

    def serve(self) -> None:
        """Write the server side, admitting nobody yet (``trust``, after a go), and start sshd; once."""
        assert self._host_key is not None
        if self.sshd is not None:
            return
        if not self._addresses:
            self._addresses = netaddr.host_addresses(self._hosts)
        directory = self._directory()
        assert self.layout is not None
        self.layout = write_server_side(
            directory, host_key=self._host_key, authorized=(), port=self.port, user=_user(),
            listen_addresses=listen_addresses(self._interface, self.host),
            # the sessions' variable names the client side written later
            session_env={**self._session_env, SSH_CONFIG_VAR: str(self.layout.ssh_config)})
        self.sshd = Sshd(self.layout, sshd_path=self.settings.sshd)
        self.sshd.start()

    def trust(self, seat: Seating) -> None:
        """A host the attempt's lead is not, after a go: its sshd started (a host that led before starts it now), its
        client side (every other active host's host key pinned), then the client keys of the hosts that launch
        something here admitted: the lead's (its probe, and mpirun's login below ``routed_radix + 2`` hosts) and
        that of the daemon that starts this host's in the launch tree (``mpi_tree.launcher``), each from its own
        addresses.  No other host's key gets in: an address taken over yields a login only where that host
        launches (docs/security.md).

        In that order: the lead's probe gets in only once both are written.  Written again only when a
        host's keys changed (one that rejoined), or after ``shut`` (a restart).
        """
        assert self._client is not None and not seat.leads
        self.serve()
        assert self.layout is not None
        hosts = seat.ctx.plan.hosts
        introductions = seat.introductions or {}
        radix = routed_radix(mpi_options(seat.ctx).custom.mpirun_args)
        launchers = dict.fromkeys((hosts[0], launcher(hosts, self.host, radix)))  # the lead first, once
        clients = tuple((introduced(introductions, host, INTRO_CLIENT_KEY), tuple(self._addresses[host]))
                        for host in launchers)
        pinned = self._peer_keys(seat)
        if ("follow", clients, pinned) == self._written:
            return
        write_client_side(self.layout.directory, client_key=self._client, host_keys=pinned, port=self.port,
                          shared_connections=False)
        admit(self.layout, clients)
        self._written = ("follow", clients, pinned)

    def lead(self, seat: Seating) -> None:
        """The attempt's lead, before mpirun: nobody admitted here; its client side with every other active host's
        host key pinned (a host that rejoined with new keys, pinned anew); then each of them probed: it lets the
        lead in only once it has written the go's keys (``trust``), so then every host is ready for whichever
        logins the tree gives it.  Shared connections of an earlier attempt are ended first: every other host
        admitted nobody from before this attempt's barrier until it had the go's keys (``shut``), and a shared
        connection would skip that in the probe."""
        assert self._client is not None and seat.leads
        directory = self._directory()
        assert self.layout is not None
        pinned = self._peer_keys(seat)
        if self._written:
            end_connections(self.layout)
        if self._written[:2] != ("lead", pinned):
            before = self._written[1] if self._written[:1] == ("lead",) else {}
            changed = sorted(host for host in pinned if host in before and pinned[host] != before[host])
            if changed:
                log(f"{self.host}: new ssh host key(s) of {', '.join(changed)}, which joined again: pinned")
            if self.sshd is not None:
                admit(self.layout, ())
            self.layout = write_client_side(directory, client_key=self._client, host_keys=pinned, port=self.port)
            self._written = ("lead", pinned)
        workers = [host for host in seat.ctx.plan.hosts if host != self.host]
        wait_for_ssh(self.layout, workers, deadline_s=min(60.0, seat.join_timeout_s), environ=self.environ)

    def _peer_keys(self, seat: Seating) -> dict[str, str]:
        """Every other active host's introduced host key (``seat.ctx``: the attempt's)."""
        introductions = seat.introductions or {}
        return {host: introduced(introductions, host, INTRO_HOST_KEY) for host in seat.ctx.plan.hosts
                if host != self.host}

    def shut(self) -> None:
        """Once an attempt has ended here (``Seating.at_attempt_end``): admit nobody until the next go's keys are
        written (``trust``)."""
        if self.sshd is not None and self.layout is not None:
            admit(self.layout, ())
            if self._written and self._written[0] == "follow":
                self._written = ()

    def close(self) -> None:
        if self.layout is not None and self._written and self._written[0] == "lead":
            end_connections(self.layout)
        if self.sshd is not None:
            self.sshd.stop()
        if self._ssh_dir is not None:
            shutil.rmtree(self._ssh_dir, ignore_errors=True)
        if self._tripwire is not None:
            self._tripwire.disarm()


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
