"""Where a job's ssh files live, and writing them safely.

Each host writes only what its side needs: a host that runs sshd (a worker)
its host key, the authorized client keys and sshd_config; a host that logs in
to others (every host: mpirun on the first, Open MPI's daemons elsewhere) its
client key, the pinned host keys and ssh_config.  The
directory is new for each job, private (0700, files 0600), on tmpfs where it
can be (/run), and removed when the job ends.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from training_toolkit.cluster.ssh.config import (
    check_port,
    render_authorized,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
)
from training_toolkit.cluster.ssh.errors import SshLayoutError
from training_toolkit.cluster.ssh.keys import KeyPair

# Characters that would need quoting, start a comment, expand as a token (%h, ~)
# or split the rsh agent string mpirun is given.  We refuse them instead.
_UNSAFE_PATH_CHARS = frozenset(" \t\r\n\"'#%\\")
DIR_PREFIX = "training-toolkit-ssh-"
_SUN_PATH = 108  # bytes of a unix socket's path on Linux, its final NUL included


def _socket_path_fits(control_path: str) -> bool:
    """Whether ssh can bind ``control_path``: %C becomes 40 characters, and ssh binds a name 17 longer first."""
    return len(control_path.replace("%C", "x" * 40).encode()) + 17 < _SUN_PATH


@dataclass(frozen=True)
class SshLayout:
    """Where our per-job ssh files live.  A value: building one touches nothing on disk."""

    directory: Path
    port: int

    @property
    def client_key(self) -> Path:
        return self.directory / "client_key"

    @property
    def authorized_keys(self) -> Path:
        return self.directory / "authorized_keys"

    @property
    def host_key(self) -> Path:
        return self.directory / "host_key"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def sshd_config(self) -> Path:
        return self.directory / "sshd_config"

    @property
    def ssh_config(self) -> Path:
        return self.directory / "ssh_config"

    @property
    def pid_file(self) -> Path:
        return self.directory / "sshd.pid"

    @property
    def sshd_log(self) -> Path:
        return self.directory / "sshd.log"

    @property
    def control_path(self) -> str | None:
        """The shared connections' socket pattern, or None where the directory's path is too long for one."""
        control = str(self.directory / "cm-%C")
        return control if _socket_path_fits(control) else None


def new_ssh_dir(parent: Path) -> Path:
    """A new private directory for one job's ssh files, under ``parent`` (``rundir.parent``: /run, a tmpfs, when we
    may write there)."""
    try:
        return Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent))
    except OSError as exc:
        raise SshLayoutError(f"{parent}: cannot create our ssh directory: {exc.strerror or exc}") from None


def write_server_side(
    directory: Path,
    *,
    host_key: KeyPair,
    authorized: Sequence[tuple[str, Sequence[str]]],
    port: int,
    user: str,
    listen_addresses: Sequence[str] = (),
    session_env: Mapping[str, str] | None = None,
) -> SshLayout:
    """What a host that runs sshd needs: its host key, the client keys it admits (each from its addresses), sshd_config.

    ``authorized``: (public key, the addresses it is admitted from) each; none admits nobody yet (``admit`` later).
    """
    layout, strict_modes = _prepare(directory, port)
    _write_file(layout.host_key, host_key.private, 0o600)
    _write_file(layout.authorized_keys, render_authorized(authorized).encode(), 0o600)
    config = render_sshd_config(host_key=layout.host_key, authorized_keys=layout.authorized_keys, pid_file=layout.pid_file,
                                port=port, user=user, listen_addresses=listen_addresses, strict_modes=strict_modes,
                                session_env=session_env)
    _write_file(layout.sshd_config, config.encode(), 0o600)
    return layout


def write_client_side(
    directory: Path,
    *,
    client_key: KeyPair,
    host_keys: Mapping[str, str],
    port: int,
    aliases: Mapping[str, Sequence[str]] | None = None,
    shared_connections: bool = True,
) -> SshLayout:
    """What a host that logs in to others needs: the client key, every peer's pinned host key, ssh_config.

    ``shared_connections``: the lead's probe leaves one connection per peer for mpirun's logins
    (``ControlMaster``); a worker's logins (tree spawn: its daemon starting others) need none.
    """
    layout, _ = _prepare(directory, port)
    known_hosts = render_known_hosts(host_keys, port=port, aliases=aliases)
    _write_file(layout.client_key, client_key.private, 0o600)
    _write_file(layout.known_hosts, known_hosts.encode(), 0o600)
    config = render_ssh_config(identity_file=layout.client_key, known_hosts=layout.known_hosts, port=port,
                               control_path=layout.control_path if shared_connections else None)
    _write_file(layout.ssh_config, config.encode(), 0o600)
    return layout


def admit(layout: SshLayout, authorized: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Replace the client keys sshd admits (each from its addresses), whole; none: nobody.

    sshd reads ``authorized_keys`` at each login, so the next connection sees the new list.
    """
    _write_file(layout.authorized_keys, render_authorized(authorized).encode(), 0o600)


def end_connections(layout: SshLayout, grace_s: float = 1.0) -> list[int]:
    """End the shared connections (``ControlMaster``) this host opened to its peers; their pids.

    Each detaches from the ssh that opened it and keeps that ssh's environment, which carries the
    token of the job's ssh directory (``probe.wait_for_ssh`` gives it; ``supervise/deadman.py``).
    """
    from training_toolkit.supervise import procfs
    from training_toolkit.supervise.stopping import stop_processes
    from training_toolkit.supervise import deadman

    masters = procfs.with_marker(deadman.marker_for(layout.directory))  # with start times: never a reused pid
    if masters:
        stop_processes(masters, grace_s)
    return [int(pid) for pid in masters]


def ssh_command(layout: SshLayout, *, ssh: str = "ssh") -> list[str]:
    """The command prefix for mpirun's rsh agent (``--mca plm_rsh_agent``) and for probes.

    Everything else (key, port, pinning) is in the config, so this stays
    short and free of spaces that the agent string could split on.
    """
    return [ssh, "-F", str(layout.ssh_config)]


def _prepare(directory: Path, port: int) -> tuple[SshLayout, bool]:
    check_port(port)
    directory = Path(os.path.abspath(directory))
    if any(ch in _UNSAFE_PATH_CHARS or not ch.isprintable() for ch in str(directory)):
        raise SshLayoutError(f"{directory}: ssh directory path must not contain whitespace, quotes, '#', '%' or '\\'")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SshLayoutError(f"{directory.parent}: cannot create: {exc.strerror or exc}") from None
    strict_modes = strict_modes_possible(directory)
    _make_private_dir(directory)
    return SshLayout(directory=directory, port=port), strict_modes


def strict_modes_possible(directory: Path) -> bool:
    """Whether sshd's StrictModes check would pass, refusing locations that are unsafe anyway.

    StrictModes walks from authorized_keys up to ``/`` and refuses any
    directory that is group/world-writable or owned by someone other than root
    or the user.  A sticky world-writable parent like /tmp fails that walk
    although nobody else can move our 0700 directory out of it: there we turn
    StrictModes off.  A non-sticky writable parent, or one owned by another
    user, is really unsafe: refused.
    """
    uid = os.geteuid()
    real = Path(os.path.realpath(directory))
    strict = True
    for ancestor in real.parents:
        st = os.stat(ancestor)
        if st.st_uid not in (0, uid):
            raise SshLayoutError(f"{directory}: parent {ancestor} is owned by uid {st.st_uid}, who could replace our ssh directory")
        if st.st_mode & 0o022:
            if not st.st_mode & stat.S_ISVTX:
                raise SshLayoutError(f"{directory}: parent {ancestor} is writable by other users, who could replace our ssh directory")
            strict = False
    return strict


def _make_private_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(directory)
        if st.st_uid != os.geteuid():
            raise SshLayoutError(f"{directory}: exists and is owned by uid {st.st_uid}, not us")
        os.chmod(directory, 0o700)
    except OSError as exc:
        raise SshLayoutError(f"{directory}: cannot create our ssh directory: {exc.strerror or exc}") from None


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` atomically, so a running sshd or ssh never reads half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
