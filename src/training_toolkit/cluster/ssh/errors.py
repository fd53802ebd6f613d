"""Errors of per-job SSH.  Messages are one line, fit for the failure file."""

from __future__ import annotations

from collections.abc import Mapping

from training_toolkit.core.errors import EXIT_CONFIG, ClusterError


class SshError(ClusterError):
    """Base class: per-job SSH could not be set up or used."""


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
        super().__init__(f"ssh could not reach {len(self.failures)} of {total} hosts within {deadline_s:g}s: {detail}")
