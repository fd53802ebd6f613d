"""The exact texts of our ssh files, as pure functions: sshd_config, ssh_config, known_hosts, authorized_keys.

Least privilege throughout: sshd takes public keys only, for one user, from
the job's hosts only, and allows nothing but running a command (no
forwarding of any kind, no agent, no tty, no user rc, no sftp); clients use
our key and our pinned host keys only and never prompt.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from pathlib import Path

from training_toolkit.cluster.ssh.errors import SshLayoutError

STANDARD_PORT = 22  # OpenSSH's own: known_hosts names a host bare on it, as [name]:port elsewhere
CONTROL_PERSIST_S = 60  # an idle shared connection lives this long (the job's end closes it sooner)


def render_sshd_config(
    *,
    host_key: Path,
    authorized_keys: Path,
    pid_file: Path,
    port: int,
    user: str,
    listen_addresses: Sequence[str] = (),
    strict_modes: bool = True,
    session_env: Mapping[str, str] | None = None,
) -> str:
    """sshd's whole config: nothing is read from /etc/ssh.

    ``UsePAM no`` because PAM stacks in slim images are often broken or absent
    and we need no session setup.  ``strict_modes`` is False only where the
    directory sits under a sticky world-writable directory such as /tmp: sshd
    checks every directory up to ``/`` and would refuse the login, although a
    0700 directory under a sticky parent cannot be swapped by others.
    ``listen_addresses`` are this host's addresses on the job's network; with
    none, sshd listens on every address (only where the interface is unknown).
    ``session_env``: variables every session gets (``SetEnv``: the Open MPI daemons'
    preload, runners/mpi.py), set by this host, never by the client; with them always
    ``no_startup_files``, so that a launch never waits on, or fails by, the user's shell start-up files.
    """
    check_port(port)
    lines = [f"HostKey {host_key}", f"Port {port}"]
    for address in listen_addresses:
        _check_address(address)
        lines.append(f"ListenAddress {_listen_form(address)}")
    lines += [
        f"AuthorizedKeysFile {authorized_keys}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        f"PermitRootLogin {'prohibit-password' if user == 'root' else 'no'}",
        f"AllowUsers {user}",
        "UsePAM no",
        f"StrictModes {'yes' if strict_modes else 'no'}",
        f"PidFile {pid_file}",
        "DisableForwarding yes",
        "AllowAgentForwarding no",
        "AllowTcpForwarding no",
        "AllowStreamLocalForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "PermitTTY no",
        "PermitUserRC no",
        "PermitUserEnvironment no",
        "MaxAuthTries 2",
        "LoginGraceTime 10",
        # unauthenticated connections: 4 at a time from one address, and the rest refused past 64
        # (OpenSSH's default lets one address hold 100 open and so lock the job's own login out)
        "PerSourceMaxStartups 4",
        "MaxStartups 64:30:128",
        "LogLevel ERROR",
    ]
    # One SetEnv line: sshd keeps the first SetEnv directive's variables and ignores every later line.
    env = {**no_startup_files(authorized_keys.parent), **(session_env or {})}
    for name, value in env.items():
        if not name.replace("_", "").isalnum() or not name.isascii() or any(ch in _UNSAFE_ENV for ch in value):
            raise SshLayoutError(f"{name}={value!r} cannot be set for sshd's sessions (a space, quote, # or control "
                                 "character, or a name that is not a variable's)")
    lines.append("SetEnv " + " ".join(f"{name}={value}" for name, value in env.items()))
    return "\n".join(lines) + "\n"


def no_startup_files(directory: Path) -> dict[str, str]:
    """What every session's shell gets so that it reads none of the user's start-up files (docs/multihost.md).

    sshd runs each command as ``SHELL -c COMMAND`` with the account's login shell.  bash reads
    ``/etc/bash.bashrc`` and ``~/.bashrc`` when it sees it was started by sshd, but only as a
    top-level shell: ``SHLVL=1`` makes it a nested one (bash adds one), so it reads nothing.
    zsh reads ``$ZDOTDIR/.zshenv`` (``~/.zshenv`` by default) for every shell: ``ZDOTDIR`` is the
    job's own private ssh directory, which holds no such file.  dash and other ``sh`` read
    nothing for ``-c``.
    """
    return {"SHLVL": "1", "ZDOTDIR": str(directory)}


_UNSAFE_ENV = frozenset(" \t\r\n\"'#\\")


def render_authorized_keys(client_public: str, allowed_from: Sequence[str]) -> str:
    """The job's client key, usable only from the job's hosts' addresses and only to run a command.

    ``restrict`` turns off every forwarding, the agent, the pty and ~/.ssh/rc;
    ``from=`` takes addresses (sshd matches names only with UseDNS, which is off).
    """
    if not allowed_from:
        raise SshLayoutError("no address to admit the job's client key from")
    for address in allowed_from:
        _check_address(address)
    key = " ".join(client_public.split())
    if len(key.split()) < 2:
        raise SshLayoutError(f"client public key {client_public!r} is not 'TYPE BASE64 [comment]'")
    return f'from="{",".join(dict.fromkeys(allowed_from))}",restrict {key}\n'


def render_authorized(entries: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Several hosts' client keys, each from its own host's addresses (``render_authorized_keys`` per key).

    No entry at all is an empty file, which admits nobody: what a host's sshd starts with before it
    knows the job's keys (runners/mpi_ssh.py).  One key several hosts hold (mounted keys: the same pair
    on every host) is one line, from all their addresses: sshd may stop at the first line of a key
    whose ``from=`` does not match.
    """
    merged: dict[str, list[str]] = {}
    comments: dict[str, str] = {}
    for public, addresses in entries:
        if not addresses:
            raise SshLayoutError(f"no address to admit the client key {public!r} from")
        key = " ".join(public.split()[:2])
        comments.setdefault(key, public)
        merged.setdefault(key, []).extend(addresses)
    return "".join(render_authorized_keys(comments[key], addresses) for key, addresses in merged.items())


def render_ssh_config(
    *,
    identity_file: Path,
    known_hosts: Path,
    port: int,
    connect_timeout_s: int = 5,
    server_alive_interval_s: int = 15,
    control_path: str | None = None,
) -> str:
    """The client config for ``ssh -F``: our key only, our pinned host keys only, never a prompt.

    ``UpdateHostKeys no`` and ``CheckHostIP no`` keep ssh from editing the
    pinned file; keep-alives let a session to a dead host fail within a
    minute instead of hanging an mpirun.  With ``control_path``, the first
    connection to a host (the readiness probe) stays open for a minute and
    later ones (mpirun's) run over it: one key exchange per host, not two.
    """
    check_port(port)
    lines = [
        "Host *",
        f"    IdentityFile {identity_file}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    UpdateHostKeys no",
        "    CheckHostIP no",
        "    BatchMode yes",
        "    ForwardAgent no",
        "    ForwardX11 no",
        "    ClearAllForwardings yes",
        f"    Port {port}",
        f"    ConnectTimeout {connect_timeout_s}",
        f"    ServerAliveInterval {server_alive_interval_s}",
        "    ServerAliveCountMax 4",
        "    LogLevel ERROR",
    ]
    if control_path:
        lines += ["    ControlMaster auto", f"    ControlPath {control_path}", f"    ControlPersist {CONTROL_PERSIST_S}"]
    return "\n".join(lines) + "\n"


def render_known_hosts(host_keys: Mapping[str, str], *, port: int, aliases: Mapping[str, Sequence[str]] | None = None) -> str:
    """Pin each host's own key under every name it may be reached by, one line per host.

    ssh looks a host up by the name it was given (``[name]:port`` off port
    22), so an mpirun hostfile naming ``algo-2`` needs ``algo-2`` here, and an
    address needs the address: ``aliases`` adds names and addresses per host.
    """
    check_port(port)
    if not host_keys:
        raise SshLayoutError("no hosts to pin a host key for")
    extra = dict(aliases or {})
    unknown = [name for name in extra if name not in host_keys]
    if unknown:
        raise SshLayoutError(f"aliases name hosts that are not in the job: {', '.join(unknown)}")
    lines = []
    for host, public in host_keys.items():
        key = " ".join(public.split()[:2])
        if len(key.split()) < 2:
            raise SshLayoutError(f"host key of {host} {public!r} is not 'TYPE BASE64 [comment]'")
        names = list(dict.fromkeys([host, *extra.get(host, ())]))
        for name in names:
            check_host_name(name)
        patterns = names if port == STANDARD_PORT else [f"[{name}]:{port}" for name in names]
        lines.append(f"{','.join(patterns)} {key}")
    return "\n".join(lines) + "\n"


def check_port(port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise SshLayoutError(f"ssh port {port!r} is not in 1-65535")


def check_host_name(name: str) -> None:
    bad = (
        not name
        or any(ch.isspace() or not ch.isprintable() for ch in name)
        or any(ch in ",#*?\"'[]@" for ch in name)
        or name[0] in "!|"
    )
    if bad:
        raise SshLayoutError(f"host name {name!r} cannot be pinned in known_hosts (empty, whitespace, or a pattern character)")


def _check_address(address: str) -> None:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise SshLayoutError(f"{address!r} is not an IP address") from None


def _listen_form(address: str) -> str:
    return f"[{address}]" if ":" in address else address
