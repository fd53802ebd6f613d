"""The user's code: fetched into the code dir, unpacked safely, installed, and turned into a command.

``sagemaker_submit_directory`` may be a local directory, a local ``.tar.gz`` or
an ``s3://`` tarball (``S3_ENDPOINT_URL`` points boto3 elsewhere, e.g. at a test
server).  As the reference, a non-empty code dir is used as it is.
"""

from __future__ import annotations

import posixpath
import shutil
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from training_toolkit.core.errors import CodeError
from training_toolkit.job.spec import JobSpec
from training_toolkit.config.settings import without_secrets


class EntryCommand(NamedTuple):
    """How the entry point runs: ``kind`` is ``python``, ``package`` or ``command``."""

    kind: str
    argv: tuple[str, ...]  # without the user's arguments


def fetch(job: JobSpec, environ: Mapping[str, str]) -> Path:
    """Put the submitted code into the code dir (unless it is there already) and return the dir."""
    code_dir = job.paths.code_dir
    source = job.submit_directory
    code_dir.mkdir(parents=True, exist_ok=True)
    if not source or any(code_dir.iterdir()):
        return code_dir
    if source.startswith("s3://"):
        import tempfile  # deferred, as every import on the launch path that a run may not need

        with tempfile.TemporaryDirectory(prefix="tt-code-") as tmp:
            archive = Path(tmp) / "sourcedir.tar.gz"
            download_s3(source, archive, environ)
            extract_tarball(archive, code_dir, label=source)
        return code_dir
    path = Path(source)
    if path.is_dir():
        if path.resolve() != code_dir.resolve():
            shutil.copytree(path, code_dir, symlinks=True, dirs_exist_ok=True)
        return code_dir
    if path.is_file():
        extract_tarball(path, code_dir, label=source)
        return code_dir
    raise CodeError(f"sagemaker_submit_directory {source!r}: no such directory, tarball or s3:// object")


def download_s3(uri: str, dest: Path, environ: Mapping[str, str]) -> None:
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not key:
        raise CodeError(f"sagemaker_submit_directory {uri!r}: expected s3://bucket/key")
    try:
        import boto3  # deferred: heavy, and only needed for s3:// code
        import botocore.exceptions
    except ImportError:
        raise CodeError(
            f"sagemaker_submit_directory {uri!r}: boto3 is not installed (pip install 'training-toolkit[s3]')"
        ) from None
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    client = boto3.session.Session().client(
        "s3", endpoint_url=environ.get("S3_ENDPOINT_URL") or None, region_name=region
    )
    try:
        client.download_file(bucket, key, str(dest))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise CodeError(f"sagemaker_submit_directory {uri!r}: download failed: {exc}") from None


def extract_tarball(archive: Path, dest: Path, label: str) -> None:
    """Unpack a tarball, refusing any member that would land outside ``dest``."""
    import tarfile

    try:
        with tarfile.open(archive, mode="r:*") as tar:
            members = tar.getmembers()
            for member in members:
                problem = _unsafe_member(member)
                if problem:
                    raise CodeError(f"{label}: refusing tar member {member.name!r}: {problem}")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # pragma: no cover - Python < 3.10.12
                tar.extractall(dest, members=members)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CodeError(f"{label}: not a readable tar.gz archive: {exc}") from None


def _unsafe_member(member) -> str | None:
    name = member.name
    if name.startswith("/") or posixpath.isabs(name):
        return "absolute path"
    if ".." in Path(name).parts:
        return "path contains '..'"
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        return "device or fifo"
    if member.issym() or member.islnk():
        target = member.linkname
        base = posixpath.dirname(name) if member.issym() else ""
        joined = posixpath.normpath(posixpath.join(base, target))
        if posixpath.isabs(target) or joined == ".." or joined.startswith("../"):
            return f"link to {target!r} leaves the code dir"
    return None


def entry_command(job: JobSpec, code_dir: Path, python: str = sys.executable) -> EntryCommand:
    """Decide how the entry point runs (pure apart from looking at the code dir)."""
    entry = job.entry_point
    if not entry:
        raise CodeError("no entry point: set the sagemaker_program hyperparameter or SAGEMAKER_PROGRAM")
    if entry.startswith(("/", "-")) or ".." in Path(entry).parts:
        raise CodeError(f"entry point {entry!r} must be a path inside the code dir")
    if (code_dir / "setup.py").is_file():
        module = entry[:-3] if entry.endswith(".py") else entry
        return EntryCommand("package", (python, "-m", module))
    target = code_dir / entry
    if not target.is_file():
        raise CodeError(f"entry point {entry!r} not found in {code_dir}")
    if entry.endswith(".py"):
        return EntryCommand("python", (python, entry))
    with open(target, "rb") as f:
        head = f.read(4)
    if head[:2] != b"#!" and head != b"\x7fELF":  # what execvp would hand to the shell anyway
        return EntryCommand("command", ("/bin/sh", str(target)))
    return EntryCommand("command", (str(target),))


def install(job: JobSpec, code_dir: Path, command: EntryCommand, environ: Mapping[str, str], python: str) -> None:
    """pip-install the code's package or requirements; make a command entry point executable."""
    from training_toolkit.supervise.process import Supervised  # deferred: keeps module import light

    if command.kind == "command":
        target = code_dir / str(job.entry_point)
        mode = target.stat().st_mode
        target.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return
    steps = []
    if (code_dir / "requirements.txt").is_file():
        steps.append(["-r", "requirements.txt"])
    if command.kind == "package":
        steps.append(["."])
    for step in steps:
        argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *step]
        child = Supervised(argv, env=without_secrets(environ), cwd=str(code_dir), stdout=2)
        status = child.wait()
        child.finish(linger_s=1.0)
        if status is None or not status.ok:
            tail = " | ".join(line for line in child.tail.lines(5) if line.strip())
            raise CodeError(f"pip install {' '.join(step)} in {code_dir} {status.describe()}: {tail}")


def prepare(job: JobSpec, environ: Mapping[str, str], python: str = sys.executable) -> tuple[Path, EntryCommand]:
    code_dir = fetch(job, environ)
    command = entry_command(job, code_dir, python)
    install(job, code_dir, command, environ, python)
    return code_dir, command


def python_for(configured: str | None) -> str:
    """The interpreter for the user's script: ours unless the setting (``Settings.python``) names another."""
    return configured or sys.executable or shutil.which("python3") or "python3"


__all__ = ["EntryCommand", "entry_command", "extract_tarball", "fetch", "install", "prepare", "python_for"]
