"""Waiting until every peer's sshd accepts the job's key: bounded, all hosts at once, each failure named."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from training_toolkit.cluster.ssh.errors import SshUnreachable
from training_toolkit.cluster.ssh.layout import SshLayout, ssh_command
from training_toolkit.config.settings import without_secrets
from training_toolkit.supervise import deadman

def wait_for_ssh(
    layout: SshLayout,
    hosts: Sequence[str],
    *,
    deadline_s: float,
    per_try_timeout_s: float = 10.0,
    ssh: str = "ssh",
    max_parallel: int = 128,
    environ: Mapping[str, str],
) -> None:
    """Return once ``ssh host true`` succeeds for every host; raise SshUnreachable naming the rest.

    A launcher that starts before its peers' sshd listens fails with a vague
    "could not connect"; this waits, all hosts at once, and gives up at the
    deadline with each missing host and its last error.  Every probe is
    killed at its own timeout, so the call never outlives the deadline by more
    than the time to reap a process.  Beyond ``max_parallel`` hosts, late
    hosts get what is left of the deadline.

    ``environ``: the toolkit's environment as read at the start (``RunContext.environ``), which ssh
    runs with (secrets left out).
    """
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        return
    from concurrent.futures import ThreadPoolExecutor  # the lead's only: 4 ms of imports (logging) for every host

    deadline = time.monotonic() + deadline_s
    prefix = ssh_command(layout, ssh=ssh)
    # the shared connection a probe leaves (ControlPersist) keeps this environment: the ssh directory's
    # token, by which end_connections finds it and the directory's deadman ends it should train be killed
    env = {**without_secrets(environ), **deadman.environment_for(layout.directory)}
    workers = max(1, min(len(hosts), max_parallel))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ssh-probe") as pool:
        errors = list(pool.map(lambda host: _probe_until(prefix, probe_target(layout, host), deadline, per_try_timeout_s, env),
                               hosts))
    failures = {host: error for host, error in zip(hosts, errors) if error is not None}
    if failures:
        raise SshUnreachable(failures, deadline_s, len(hosts))


def probe_target(layout: SshLayout, host: str) -> list[str]:
    """What the probe asks of ``host``: a login that runs nothing, kept as the shared connection when there is one.

    With a control path, ``-N`` under ``ControlPersist`` returns once the
    key is accepted and leaves the connection open for mpirun's sessions: no
    command, so no login shell runs on the peer (a root ``.bashrc`` can cost
    more than the login itself).  ``-S`` repeats the config's path so the
    connection's command line names the job's directory, which is how
    ``end_connections`` finds it.  Without one (a directory too long for a
    socket), ``-N`` would never return: the probe runs ``true``.
    """
    if layout.control_path is None:
        return [host, "true"]
    return ["-S", layout.control_path, "-N", host]


def _probe_until(prefix: Sequence[str], target: Sequence[str], deadline: float, per_try_timeout_s: float,
                 env: Mapping[str, str]) -> str | None:
    """Probe one host (``target``'s host) until it answers (None) or the deadline passes (its last error)."""
    last_error: str | None = None
    backoff = 0.1
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return last_error or "not tried before the deadline"
        timeout = min(per_try_timeout_s, remaining)
        error, timed_out = _probe_once(prefix, target, timeout, env)
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


def _probe_once(prefix: Sequence[str], target: Sequence[str], timeout_s: float,
                env: Mapping[str, str]) -> tuple[str | None, bool]:
    """One login: (None, False) on success, else (last error line, whether it timed out)."""
    connect_timeout = max(1, math.ceil(timeout_s))
    argv = [*prefix, "-o", f"ConnectTimeout={connect_timeout}", *target]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env),
        )
    except OSError as exc:
        return f"cannot run {argv[0]}: {exc.strerror or exc}", False
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.kill()
        proc.communicate()
        return f"no answer within {timeout_s:.1f}s", True
    if proc.returncode == 0:
        return None, False
    lines = [line.strip() for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    return (lines[-1] if lines else f"ssh exited with code {proc.returncode}"), False
