"""Passwordless SSH between the hosts of one job, set up per job and pinned.

MPI launchers start remote ranks over ssh.  The usual recipes bake a key into
the image and switch host-key checking off; both leak trust beyond the job.
Here every piece is per job and lives in a directory of our own (never
``~/.ssh``, which belongs to the user and may be read-only or shared):

* keys come from the job (mounted files, or derived from the job's secret so
  every host computes the same keys without a shared disk);
* our sshd runs with its own config (``-f``), never the system one, so a base
  image's ``/etc/ssh`` cannot weaken or break it;
* clients use ``ssh -F <our config>``, which also skips ``/etc/ssh/ssh_config``
  and ``~/.ssh/config``; the job's host key is pinned in our ``known_hosts``
  under every name a peer is reached by, so there is never a prompt and never
  ``StrictHostKeyChecking no``.

Every host must write its directory at the same path: Open MPI's tree spawn
runs the rsh agent (``ssh -F <path>``) on remote hosts too.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import psutil
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from training_toolkit.errors import EXIT_CONFIG, ClusterError

# Names of mounted key files that load_keys expects (any key type OpenSSH accepts,
# whatever the name says: these are the names users already know).
MOUNTED_CLIENT_KEY = "id_ed25519"
MOUNTED_CLIENT_PUBLIC = "id_ed25519.pub"
MOUNTED_HOST_KEY = "ssh_host_ed25519_key"
MOUNTED_HOST_PUBLIC = "ssh_host_ed25519_key.pub"
MOUNTED_FILES = (MOUNTED_CLIENT_KEY, MOUNTED_CLIENT_PUBLIC, MOUNTED_HOST_KEY, MOUNTED_HOST_PUBLIC)

# Shorter secrets would let anyone who sees a public key search for the secret offline.
MIN_SECRET_BYTES = 16

_HKDF_SALT = b"training-toolkit ssh v1"
_CLIENT_INFO = b"training-toolkit ssh client ed25519 key v1"
_HOST_INFO = b"training-toolkit ssh host ed25519 key v1"

DEFAULT_SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
# sshd's children get a fresh environment anyway; this keeps the job's secrets
# out of the listener's /proc/<pid>/environ.
_SSHD_ENV = MappingProxyType({"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})

# Characters that would need quoting, start a comment, expand as a token (%h, ~)
# or split the rsh agent string mpirun is given.  We refuse them instead.
_UNSAFE_PATH_CHARS = frozenset(" \t\r\n\"'#%\\")


# --------------------------------------------------------------------------- errors


class SshError(ClusterError):
    """Base class: per-job SSH could not be set up or used.  Messages are one line."""


class KeyMaterialError(SshError):
    """The job's key material is missing, unreadable or unusable."""

    exit_code = EXIT_CONFIG


class SshLayoutError(SshError):
    """Our ssh directory cannot be written safely, or a host name cannot be pinned."""

    exit_code = EXIT_CONFIG


class SshdError(SshError):
    """sshd rejected its config, could not listen, or exited."""


class SshUnreachable(SshError):
    """Some hosts never accepted an ssh login before the deadline.

    ``failures`` maps each such host to the last error line seen for it, so the
    message can name every host and why, instead of "could not connect to some hosts".
    """

    def __init__(self, failures: Mapping[str, str], deadline_s: float, total: int):
        self.failures = dict(failures)
        self.deadline_s = deadline_s
        detail = "; ".join(f"{host} ({reason})" for host, reason in self.failures.items())
        super().__init__(
            f"ssh could not reach {len(self.failures)} of {total} hosts within {deadline_s:g}s: {detail}"
        )


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class KeyMaterial:
    """The job's client key pair and host key pair, as OpenSSH files hold them.

    One client key for every host and one host key for every host: the trust
    boundary is the job, and identical keys need no exchange between hosts.
    Private keys are left out of ``repr`` so they never reach a log.
    """

    client_private: bytes = field(repr=False)
    client_public: str
    host_private: bytes = field(repr=False)
    host_public: str


def derive_keys(secret: bytes, job_label: str = "") -> KeyMaterial:
    """Derive the job's ed25519 keys from its secret, byte for byte the same on every host.

    HKDF-SHA256 with one ``info`` label per key gives two independent seeds,
    so knowing one key says nothing about the other.  The private key file is
    serialized by hand because ``cryptography`` puts a random check value in
    OpenSSH private keys; ours is derived too, so the output is reproducible.
    ``job_label`` only goes into the key comments (to recognise a job's key in
    authorized_keys or logs); the keys depend on the secret alone, so hosts
    that disagree on a label still trust each other.
    """
    if not isinstance(secret, (bytes, bytearray)):
        raise KeyMaterialError(f"the job secret must be bytes, not {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise KeyMaterialError(
            f"the job secret is {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed to derive ssh keys"
        )
    if job_label and (any(ch.isspace() or not ch.isprintable() for ch in job_label)):
        raise KeyMaterialError(f"job label {job_label!r} must be printable with no whitespace")
    suffix = f"@{job_label}" if job_label else ""
    client_priv, client_pub = _derived_ed25519(bytes(secret), _CLIENT_INFO, f"training-toolkit-client{suffix}")
    host_priv, host_pub = _derived_ed25519(bytes(secret), _HOST_INFO, f"training-toolkit-host{suffix}")
    return KeyMaterial(client_private=client_priv, client_public=client_pub, host_private=host_priv, host_public=host_pub)


def _derived_ed25519(secret: bytes, info: bytes, comment: str) -> tuple[bytes, str]:
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=_HKDF_SALT, info=info).derive(secret)
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return _openssh_ed25519_private(seed, public, comment), _openssh_ed25519_public(public, comment)


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _ed25519_blob(public: bytes) -> bytes:
    return _ssh_string(b"ssh-ed25519") + _ssh_string(public)


def _openssh_ed25519_public(public: bytes, comment: str) -> str:
    return f"ssh-ed25519 {base64.b64encode(_ed25519_blob(public)).decode()} {comment}"


def _openssh_ed25519_private(seed: bytes, public: bytes, comment: str) -> bytes:
    """The ``openssh-key-v1`` format (OpenSSH's PROTOCOL.key), unencrypted.

    The check value only detects a wrong passphrase on encrypted keys; taking
    it from the public key keeps the file deterministic at no cost.
    """
    blob = _ed25519_blob(public)
    check = hashlib.sha256(blob).digest()[:4]
    secret_part = (
        check
        + check
        + _ssh_string(b"ssh-ed25519")
        + _ssh_string(public)
        + _ssh_string(seed + public)
        + _ssh_string(comment.encode())
    )
    secret_part += bytes(range(1, 1 + (-len(secret_part)) % 8))
    body = (
        b"openssh-key-v1\0"
        + _ssh_string(b"none")  # cipher
        + _ssh_string(b"none")  # kdf
        + _ssh_string(b"")  # kdf options
        + struct.pack(">I", 1)  # number of keys
        + _ssh_string(blob)
        + _ssh_string(secret_part)
    )
    encoded = base64.b64encode(body).decode()
    lines = [encoded[i : i + 70] for i in range(0, len(encoded), 70)]
    return ("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END OPENSSH PRIVATE KEY-----\n").encode()


def load_keys(directory: Path) -> KeyMaterial:
    """Read mounted key files (``MOUNTED_FILES``) and check that each pair belongs together.

    Only the contents are taken: ``write_ssh_dir`` writes them again with the
    modes OpenSSH insists on, so a Kubernetes secret mounted 0644 (which ssh
    and sshd refuse as "UNPROTECTED PRIVATE KEY FILE") still works and the
    user never has to fix permissions.  Mismatches are caught here, where the
    file can be named, rather than as "Permission denied (publickey)" later.
    """
    directory = Path(directory)
    client_private = _normalized_private(_read_mounted(directory, MOUNTED_CLIENT_KEY), directory / MOUNTED_CLIENT_KEY)
    client_public = _read_public(directory, MOUNTED_CLIENT_PUBLIC)
    host_private = _normalized_private(_read_mounted(directory, MOUNTED_HOST_KEY), directory / MOUNTED_HOST_KEY)
    host_public = _read_public(directory, MOUNTED_HOST_PUBLIC)
    _check_pair(directory / MOUNTED_CLIENT_KEY, client_private, directory / MOUNTED_CLIENT_PUBLIC, client_public)
    _check_pair(directory / MOUNTED_HOST_KEY, host_private, directory / MOUNTED_HOST_PUBLIC, host_public)
    return KeyMaterial(client_private=client_private, client_public=client_public, host_private=host_private, host_public=host_public)


def _read_mounted(directory: Path, name: str) -> bytes:
    path = directory / name
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KeyMaterialError(
            f"{path}: missing (a key directory needs {', '.join(MOUNTED_FILES)})"
        ) from None
    except OSError as exc:
        raise KeyMaterialError(f"{path}: unreadable: {exc.strerror or exc}") from None


def _normalized_private(data: bytes, path: Path) -> bytes:
    # Secrets edited on Windows arrive with CRLF, and OpenSSH wants the final newline.
    data = data.replace(b"\r\n", b"\n").strip() + b"\n"
    if b"PRIVATE KEY-----" not in data:
        raise KeyMaterialError(f"{path}: not a PEM or OpenSSH private key")
    return data


def _read_public(directory: Path, name: str) -> str:
    path = directory / name
    lines = [line.strip() for line in _read_mounted(directory, name).decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if len(lines) != 1 or len(lines[0].split()) < 2:
        raise KeyMaterialError(f"{path}: expected one line 'TYPE BASE64 [comment]'")
    try:
        serialization.load_ssh_public_key(" ".join(lines[0].split()[:2]).encode())
    except UnsupportedAlgorithm:
        pass  # a type OpenSSH may know (security keys) but cryptography does not
    except ValueError as exc:
        raise KeyMaterialError(f"{path}: not an OpenSSH public key: {exc}") from None
    return lines[0]


def _check_pair(private_path: Path, private: bytes, public_path: Path, public: str) -> None:
    try:
        try:
            key = serialization.load_ssh_private_key(private, password=None)
        except ValueError:
            key = serialization.load_pem_private_key(private, password=None)
    except UnsupportedAlgorithm:
        return  # cannot check what cryptography cannot parse; OpenSSH will judge
    except TypeError:
        raise KeyMaterialError(f"{private_path}: protected by a passphrase, which a batch login cannot enter") from None
    except ValueError as exc:
        raise KeyMaterialError(f"{private_path}: not a private key OpenSSH can use: {exc}") from None
    try:
        derived = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    except (ValueError, TypeError, AttributeError):
        return  # a type with no OpenSSH public form in cryptography
    if derived.decode().split()[:2] != public.split()[:2]:
        raise KeyMaterialError(f"{public_path}: does not match the private key {private_path.name}")


# --------------------------------------------------------------------------- layout and configs


@dataclass(frozen=True)
class SshLayout:
    """Where our per-job ssh files live.  A value: building one touches nothing on disk.

    The file names are ours, neutral about the key type (a mounted RSA key is
    fine), and fixed so that every host can compute every path.
    """

    directory: Path
    port: int

    @property
    def client_key(self) -> Path:
        return self.directory / "client_key"

    @property
    def client_public_key(self) -> Path:
        return self.directory / "client_key.pub"

    @property
    def authorized_keys(self) -> Path:
        return self.directory / "authorized_keys"

    @property
    def host_key(self) -> Path:
        return self.directory / "host_key"

    @property
    def host_public_key(self) -> Path:
        return self.directory / "host_key.pub"

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


def render_sshd_config(
    *,
    host_key: Path,
    authorized_keys: Path,
    pid_file: Path,
    port: int,
    listen_address: str | None = None,
    strict_modes: bool = True,
) -> str:
    """sshd's whole config: public keys only, our files only, nothing read from /etc/ssh.

    ``UsePAM no`` because PAM stacks in slim images are often broken or absent
    and we need no session setup.  ``strict_modes`` is False only where the
    directory sits under a sticky world-writable directory such as /tmp: sshd
    checks every directory up to ``/`` and would refuse the login, although a
    0700 directory under a sticky parent cannot be swapped by others
    (``write_ssh_dir`` works this out).  ``internal-sftp`` because scp in
    OpenSSH 9 speaks sftp, and it needs no helper binary.
    """
    lines = [
        f"HostKey {host_key}",
        f"Port {port}",
    ]
    if listen_address:
        lines.append(f"ListenAddress {listen_address}")
    lines += [
        f"AuthorizedKeysFile {authorized_keys}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        f"StrictModes {'yes' if strict_modes else 'no'}",
        f"PidFile {pid_file}",
        "Subsystem sftp internal-sftp",
        "LogLevel ERROR",
    ]
    return "\n".join(lines) + "\n"


def render_ssh_config(
    *,
    identity_file: Path,
    known_hosts: Path,
    port: int,
    connect_timeout_s: int = 5,
    server_alive_interval_s: int = 15,
) -> str:
    """The client config for ``ssh -F``: our key only, our pinned host key only, never a prompt.

    ``UpdateHostKeys no`` and ``CheckHostIP no`` keep ssh from editing the
    pinned file; keep-alives let a session to a dead host fail within a
    minute instead of hanging an mpirun.
    """
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
        f"    Port {port}",
        f"    ConnectTimeout {connect_timeout_s}",
        f"    ServerAliveInterval {server_alive_interval_s}",
        "    ServerAliveCountMax 4",
        "    LogLevel ERROR",
    ]
    return "\n".join(lines) + "\n"


def render_known_hosts(
    host_public: str,
    hosts: Sequence[str],
    *,
    port: int,
    extra_known_names: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """Pin the job's host key under every name a peer may be reached by, one line per host.

    ssh looks a host up by the name it was given (``[name]:port`` off port
    22), so an mpirun hostfile naming ``algo-2`` needs ``algo-2`` here, and an
    address needs the address: ``extra_known_names`` adds aliases and
    addresses per host.
    """
    _check_port(port)
    key = " ".join(host_public.split())
    if len(key.split()) < 2:
        raise SshLayoutError(f"host public key {host_public!r} is not 'TYPE BASE64 [comment]'")
    if not hosts:
        raise SshLayoutError("no hosts to pin the host key for")
    extra = dict(extra_known_names or {})
    unknown = [name for name in extra if name not in hosts]
    if unknown:
        raise SshLayoutError(f"extra_known_names names hosts that are not in the job: {', '.join(unknown)}")
    lines = []
    for host in dict.fromkeys(hosts):
        names = list(dict.fromkeys([host, *extra.get(host, ())]))
        for name in names:
            _check_host_name(name)
        patterns = names if port == 22 else [f"[{name}]:{port}" for name in names]
        lines.append(f"{','.join(patterns)} {key}")
    return "\n".join(lines) + "\n"


def write_ssh_dir(
    directory: Path,
    keys: KeyMaterial,
    hosts: Sequence[str],
    *,
    port: int,
    listen_address: str | None = None,
    extra_known_names: Mapping[str, Sequence[str]] | None = None,
) -> SshLayout:
    """Write our ssh directory (0700, private files 0600) and return where everything is.

    Files are replaced atomically so a running sshd or ssh never reads half a
    file.  The location is checked first: a directory another user could
    rename or replace (a non-sticky writable parent, a parent owned by someone
    else) is refused, because sshd would trust whatever ends up there.
    """
    _check_port(port)
    directory = Path(os.path.abspath(directory))
    _check_path_chars(directory)
    if listen_address is not None and (not listen_address or any(ch.isspace() for ch in listen_address)):
        raise SshLayoutError(f"listen address {listen_address!r} is empty or contains whitespace")
    known_hosts = render_known_hosts(keys.host_public, hosts, port=port, extra_known_names=extra_known_names)
    _make_parents(directory)
    strict_modes = _strict_modes_possible(directory)
    _make_private_dir(directory)
    layout = SshLayout(directory=directory, port=port)
    _write_file(layout.client_key, keys.client_private, 0o600)
    _write_file(layout.client_public_key, (keys.client_public.strip() + "\n").encode(), 0o644)
    _write_file(layout.authorized_keys, (keys.client_public.strip() + "\n").encode(), 0o600)
    _write_file(layout.host_key, keys.host_private, 0o600)
    _write_file(layout.host_public_key, (keys.host_public.strip() + "\n").encode(), 0o644)
    _write_file(layout.known_hosts, known_hosts.encode(), 0o644)
    sshd_config = render_sshd_config(
        host_key=layout.host_key,
        authorized_keys=layout.authorized_keys,
        pid_file=layout.pid_file,
        port=port,
        listen_address=listen_address,
        strict_modes=strict_modes,
    )
    _write_file(layout.sshd_config, sshd_config.encode(), 0o600)
    ssh_config = render_ssh_config(identity_file=layout.client_key, known_hosts=layout.known_hosts, port=port)
    _write_file(layout.ssh_config, ssh_config.encode(), 0o600)
    return layout


def ssh_command(layout: SshLayout, *, ssh: str = "ssh") -> list[str]:
    """The command prefix for mpirun's rsh agent (``--mca plm_rsh_agent``) and for probes.

    Everything else (key, port, pinning) is in the config, so this stays
    short and free of spaces that the agent string could split on.
    """
    return [ssh, "-F", str(layout.ssh_config)]


def _check_port(port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise SshLayoutError(f"ssh port {port!r} is not in 1-65535")


def _check_host_name(name: str) -> None:
    bad = (
        not name
        or any(ch.isspace() or not ch.isprintable() for ch in name)
        or any(ch in ",#*?\"'[]@" for ch in name)
        or name[0] in "!|"
    )
    if bad:
        raise SshLayoutError(f"host name {name!r} cannot be pinned in known_hosts (empty, whitespace, or a pattern character)")


def _check_path_chars(path: Path) -> None:
    if any(ch in _UNSAFE_PATH_CHARS or not ch.isprintable() for ch in str(path)):
        raise SshLayoutError(f"{path}: ssh directory path must not contain whitespace, quotes, '#', '%' or '\\'")


def _strict_modes_possible(directory: Path) -> bool:
    """Whether sshd's StrictModes check would pass, refusing locations that are unsafe anyway.

    StrictModes walks from authorized_keys up to ``/`` (outside the home
    directory) and refuses any directory that is group/world-writable or owned
    by someone other than root or the user.  A sticky world-writable parent
    like /tmp fails that walk although nobody else can move our 0700
    directory out of it: there we turn StrictModes off.  A non-sticky writable
    parent, or one owned by another user, is really unsafe: refused.
    """
    uid = os.geteuid()
    real = Path(os.path.realpath(directory))
    strict = True
    for ancestor in real.parents:
        st = os.stat(ancestor)
        if st.st_uid not in (0, uid):
            raise SshLayoutError(
                f"{directory}: parent {ancestor} is owned by uid {st.st_uid}, who could replace our ssh directory"
            )
        if st.st_mode & 0o022:
            if not st.st_mode & stat.S_ISVTX:
                raise SshLayoutError(
                    f"{directory}: parent {ancestor} is writable by other users, who could replace our ssh directory"
                )
            strict = False
    return strict


def _make_parents(directory: Path) -> None:
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SshLayoutError(f"{directory.parent}: cannot create: {exc.strerror or exc}") from None


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


# --------------------------------------------------------------------------- sshd


class Sshd:
    """Our sshd, in the foreground under our control, for the lifetime of one job.

    ``-D`` keeps it our child, so we notice when it dies and it never outlives
    the job; ``-e`` sends its log to ``layout.sshd_log``, a file rather than a
    pipe nobody drains (a full pipe would block sshd's logging and so its
    logins).  sshd writes its PidFile only after binding its sockets, which
    makes the PidFile holding our child's pid a reliable "listening" signal.
    """

    def __init__(
        self,
        layout: SshLayout,
        *,
        sshd_path: str | None = None,
        privsep_dir: Path = PRIVSEP_DIR,
        start_timeout_s: float = 5.0,
        stop_grace_s: float = 2.0,
    ):
        resolved = sshd_path or shutil.which("sshd") or DEFAULT_SSHD
        if not os.path.isabs(resolved):
            resolved = shutil.which(resolved) or os.path.abspath(resolved)
        # sshd re-executes itself for every connection and refuses a relative path.
        self.sshd_path = resolved
        self.layout = layout
        self.privsep_dir = Path(privsep_dir)
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Validate the config with ``sshd -t``, start sshd, and return once it listens."""
        with self._lock:
            if self._proc is not None:
                raise SshdError("this sshd was already started")
            if not os.access(self.sshd_path, os.X_OK):
                raise SshdError(f"sshd not found or not executable at {self.sshd_path} (is openssh-server installed?)")
            self._ensure_privsep_dir()
            self._validate()
            with open(self.layout.sshd_log, "ab") as log:
                offset = log.tell()
                self._proc = subprocess.Popen(
                    [self.sshd_path, "-D", "-e", "-f", str(self.layout.sshd_config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=dict(_SSHD_ENV),
                    start_new_session=True,
                    close_fds=True,
                )
        try:
            self._wait_listening(offset)
        except BaseException:
            self.stop()
            raise

    def _ensure_privsep_dir(self) -> None:
        # sshd refuses to start without it; tmpfs /run in containers starts empty.
        try:
            self.privsep_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        except PermissionError:
            return  # not root: sshd -t names the problem if it matters

    def _validate(self) -> None:
        try:
            result = subprocess.run(
                [self.sshd_path, "-t", "-f", str(self.layout.sshd_config)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=dict(_SSHD_ENV),
                timeout=30,
            )
        except subprocess.TimeoutExpired:
            raise SshdError(f"sshd -t -f {self.layout.sshd_config} did not finish within 30s") from None
        if result.returncode != 0:
            reason = _one_line(result.stderr) or f"exit code {result.returncode}"
            raise SshdError(f"sshd rejected {self.layout.sshd_config}: {reason}")

    def _wait_listening(self, log_offset: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.005
        while True:
            code = self._proc.poll()
            if code is not None:
                lines = _log_lines(self.layout.sshd_log, log_offset)
                bind = next((line for line in lines if "bind" in line.lower()), None)
                if bind is not None:
                    raise SshdError(f"sshd could not listen on port {self.layout.port}: {bind}")
                reason = lines[-1] if lines else "no output"
                raise SshdError(f"sshd exited with code {code} at startup: {reason}")
            if _read_pid(self.layout.pid_file) == self._proc.pid:
                # sshd carries on when one address family is taken (another process on
                # 0.0.0.0:22, sshd up on [::]:22): peers would reach the other process.
                lines = _log_lines(self.layout.sshd_log, log_offset)
                bind = next((line for line in lines if "Bind to port" in line and "failed" in line), None)
                if bind is not None:
                    raise SshdError(f"sshd could not listen on port {self.layout.port}: {bind}")
                return
            if time.monotonic() >= deadline:
                raise SshdError(f"sshd did not start listening on port {self.layout.port} within {self.start_timeout_s:g}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def stop(self) -> None:
        """End sshd and every session it started; safe to call again.

        Each connection runs in its own session (sshd calls setsid), so a
        process-group kill would miss them.  The listener is frozen with
        SIGSTOP while its descendants are listed, so no new connection slips
        in between; then everything gets SIGTERM, and SIGKILL after the grace.
        """
        with self._lock:
            proc = self._proc
            if proc is None or proc.returncode is not None:
                return
            victims: list[psutil.Process] = []
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGSTOP)
                    victims = psutil.Process(proc.pid).children(recursive=True)
                except (ProcessLookupError, psutil.Error):
                    pass
                for victim in victims:
                    _quiet(victim.terminate)
                _quiet(lambda: os.kill(proc.pid, signal.SIGTERM))
                _quiet(lambda: os.kill(proc.pid, signal.SIGCONT))
            try:
                proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _end_processes(victims, self.stop_grace_s)

    def __enter__(self) -> Sshd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _end_processes(processes: Sequence[psutil.Process], grace_s: float) -> None:
    """Wait for processes we signalled, then SIGKILL what is left; zombies count as gone."""
    deadline = time.monotonic() + grace_s
    left = list(processes)
    while left:
        left = [p for p in left if _alive(p)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for proc in left:
        _quiet(proc.kill)
    for proc in processes:
        # Reaps them when we are a subreaper they were re-parented to; else a no-op.
        _quiet(lambda pid=proc.pid: os.waitpid(pid, os.WNOHANG))


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _log_lines(path: Path, offset: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(65536)
    except OSError:
        return []
    return [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]


def _one_line(data: bytes) -> str:
    return " / ".join(line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip())


def _quiet(action) -> object:
    try:
        return action()
    except Exception:  # noqa: BLE001 - the process may be gone already
        return None


# --------------------------------------------------------------------------- readiness


def wait_for_ssh(
    layout: SshLayout,
    hosts: Sequence[str],
    *,
    deadline_s: float,
    per_try_timeout_s: float = 10.0,
    ssh: str = "ssh",
    max_parallel: int = 128,
) -> None:
    """Return once ``ssh host true`` succeeds for every host; raise SshUnreachable naming the rest.

    A launcher that starts before its peers' sshd listens fails with a vague
    "could not connect"; this waits, all hosts at once, and gives up at the
    deadline with each missing host and its last error.  Every probe is
    killed at its own timeout, so the call never outlives the deadline by more
    than the time to reap a process.  Beyond ``max_parallel`` hosts, late
    hosts get what is left of the deadline.
    """
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        return
    deadline = time.monotonic() + deadline_s
    prefix = ssh_command(layout, ssh=ssh)
    workers = max(1, min(len(hosts), max_parallel))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ssh-probe") as pool:
        errors = list(pool.map(lambda host: _probe_until(prefix, host, deadline, per_try_timeout_s), hosts))
    failures = {host: error for host, error in zip(hosts, errors) if error is not None}
    if failures:
        raise SshUnreachable(failures, deadline_s, len(hosts))


def _probe_until(prefix: Sequence[str], host: str, deadline: float, per_try_timeout_s: float) -> str | None:
    """Probe one host until it answers (None) or the deadline passes (its last error)."""
    last_error: str | None = None
    backoff = 0.1
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return last_error or "not tried before the deadline"
        timeout = min(per_try_timeout_s, remaining)
        error, timed_out = _probe_once(prefix, host, timeout)
        if error is None:
            return None
        # A try the deadline cut short says less than a real error seen before it.
        if not (timed_out and timeout < per_try_timeout_s and last_error is not None):
            last_error = error
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return last_error
        time.sleep(min(backoff, remaining))
        backoff = min(backoff * 2, 1.0)


def _probe_once(prefix: Sequence[str], host: str, timeout_s: float) -> tuple[str | None, bool]:
    """One ``ssh host true``: (None, False) on success, else (last error line, whether it timed out)."""
    connect_timeout = max(1, math.ceil(timeout_s))
    argv = [*prefix, "-o", f"ConnectTimeout={connect_timeout}", host, "true"]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return f"cannot run {argv[0]}: {exc.strerror or exc}", False
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _quiet(lambda: os.killpg(proc.pid, signal.SIGKILL))
        proc.kill()
        proc.communicate()
        return f"no answer within {timeout_s:.1f}s", True
    if proc.returncode == 0:
        return None, False
    lines = [line.strip() for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    return (lines[-1] if lines else f"ssh exited with code {proc.returncode}"), False
