"""Key material as a platform mounts it, for tests of mounted keys."""

from __future__ import annotations

from pathlib import Path

from training_toolkit.cluster.ssh.keys import MOUNTED_FILES, KeyPair


def mount_keys(directory: Path, client: KeyPair, host: KeyPair, file_mode: int = 0o644) -> Path:
    """Write the job's keys the way a Kubernetes secret volume does: world-readable (``file_mode``)."""
    directory.mkdir()
    contents = (client.private, client.public + "\n", host.private, host.public + "\n")
    for name, content in zip(MOUNTED_FILES, contents):
        path = directory / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        path.chmod(file_mode)
    return directory
