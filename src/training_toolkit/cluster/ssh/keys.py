"""The job's SSH keys: made here from the OS's random generator, or read from a mounted secret.

Without mounted keys, every private key is generated on the host that uses it
(each host's client key, for mpirun's and its daemons' logins: tree spawn; each
host key on its own host) and never leaves it: only public keys travel, over the
control channel.
Nothing an outsider can know (job name, host names, the toolkit's code) helps
to compute them.  See docs/security.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from training_toolkit.cluster.ssh.errors import KeyMaterialError
from training_toolkit.config.settings import KeyFiles

# Names of mounted key files (any key type OpenSSH accepts, whatever the name says:
# these are the names users already know).
MOUNTED_CLIENT_KEY = "id_ed25519"
MOUNTED_CLIENT_PUBLIC = "id_ed25519.pub"
MOUNTED_HOST_KEY = "ssh_host_ed25519_key"
MOUNTED_HOST_PUBLIC = "ssh_host_ed25519_key.pub"
MOUNTED_FILES = (MOUNTED_CLIENT_KEY, MOUNTED_CLIENT_PUBLIC, MOUNTED_HOST_KEY, MOUNTED_HOST_PUBLIC)


@dataclass(frozen=True)
class KeyPair:
    """A private key as OpenSSH reads it, and its public line.  The private half never reaches a repr."""

    private: bytes = field(repr=False)
    public: str


@dataclass(frozen=True)
class MountedKeys:
    client: KeyPair
    host: KeyPair


def generate_keypair(comment: str) -> KeyPair:
    """A fresh ed25519 key pair from the OS's random generator."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return KeyPair(private, f"{public.decode()} {comment}")


def check_public_line(line: str, source: str) -> str:
    """One OpenSSH public key line 'TYPE BASE64 [comment]', normalised; a KeyMaterialError naming ``source`` if not."""
    parts = line.split()
    if len(parts) < 2 or any(not part.isprintable() for part in parts):
        raise KeyMaterialError(f"{source}: expected one line 'TYPE BASE64 [comment]'")
    try:
        serialization.load_ssh_public_key(" ".join(parts[:2]).encode())
    except UnsupportedAlgorithm:
        pass  # a type OpenSSH may know (security keys) but cryptography does not
    except ValueError as exc:
        raise KeyMaterialError(f"{source}: not an OpenSSH public key: {exc}") from None
    return " ".join(parts)


def load_keys(source: Path | KeyFiles) -> MountedKeys:
    """Read mounted key files (``MOUNTED_FILES``, or as ``KeyFiles`` names them) and check each pair.

    A ``KeyFiles`` without a host key (mpi-operator mounts none) gets a fresh one, made here
    from the OS's random generator, as for a job without mounted keys.

    Only the contents are taken: the ssh directory is written again with the
    modes OpenSSH insists on, so a Kubernetes secret mounted 0644 (which ssh
    and sshd refuse as "UNPROTECTED PRIVATE KEY FILE") still works and the
    user never has to fix permissions.  Mismatches are caught here, where the
    file can be named, rather than as "Permission denied (publickey)" later.
    """
    files = source if isinstance(source, KeyFiles) else KeyFiles(str(source))
    directory = Path(files.directory)
    pairs = []
    for private_name, public_name in ((files.client, files.client_public), (files.host, files.host_public)):
        if private_name is None or public_name is None:
            pairs.append(generate_keypair("training-toolkit-host"))
            continue
        private = _normalized_private(_read_mounted(directory, private_name), directory / private_name)
        public = _read_public(directory, public_name)
        _check_pair(directory / private_name, private, directory / public_name, public)
        pairs.append(KeyPair(private, public))
    return MountedKeys(client=pairs[0], host=pairs[1])


def _read_mounted(directory: Path, name: str) -> bytes:
    path = directory / name
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KeyMaterialError(f"{path}: missing (a key directory needs {', '.join(MOUNTED_FILES)})") from None
    except OSError as exc:
        raise KeyMaterialError(f"{path}: unreadable: {exc.strerror or exc}") from None


def _normalized_private(data: bytes, path: Path) -> bytes:
    # Secrets edited on Windows arrive with CRLF, and OpenSSH wants the final newline.
    data = data.replace(b"\r\n", b"\n").strip() + b"\n"
    if b"PRIVATE KEY-----" not in data:
        raise KeyMaterialError(f"{path}: not a PEM or OpenSSH private key")
    return data


def _read_public(directory: Path, name: str) -> str:
    text = _read_mounted(directory, name).decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if len(lines) != 1:
        raise KeyMaterialError(f"{directory / name}: expected one line 'TYPE BASE64 [comment]'")
    return check_public_line(lines[0], str(directory / name))


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
