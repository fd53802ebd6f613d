"""Our sshd, started with our config for the lifetime of one job, and stopped with every session it opened."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import MappingProxyType

from training_toolkit.supervise import deadman, procfs
from training_toolkit.cluster.ssh.errors import SshdError
from training_toolkit.cluster.ssh.layout import SshLayout
from training_toolkit.supervise.stopping import stop_processes

DEFAULT_SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
# sshd's children get a fresh environment anyway; this keeps the job's secrets
# out of the listener's /proc/<pid>/environ.
_SSHD_ENV = MappingProxyType({"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})

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
            # its title overwrites its environment, so it carries no token: the deadman of its directory holds it
            deadman.watch_for(self.layout.directory, self._proc.pid)
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
        in between; then everything gets SIGTERM (and SIGCONT), and SIGKILL
        after the grace.
        """
        with self._lock:
            proc = self._proc
            if proc is None or proc.returncode is not None:
                return
            sessions: list[procfs.Proc] = []
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGSTOP)  # no new session while they are listed
                except ProcessLookupError:
                    pass
                sessions = [p for p in procfs.descendants(proc.pid) if not p.zombie]
            stop_processes([*sessions, proc], self.stop_grace_s)

    def __enter__(self) -> Sshd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
