"""Errors the toolkit raises for bad input or a broken environment, and their exit codes.

Each error is one line naming what is wrong, so it can go straight into the
failure file.  The exit codes keep toolkit failures apart from the user script's
own codes (see docs/contract.md, "Exit codes").
"""

from __future__ import annotations

EXIT_USAGE = 64  # bad command line
EXIT_CODE_ERROR = 66  # the user's code could not be fetched or installed
EXIT_CLUSTER_ERROR = 69  # other hosts never joined, ssh unreachable, the job failed elsewhere
EXIT_INTERNAL = 70  # a bug in the toolkit
EXIT_CONFIG = 78  # malformed or inconsistent /opt/ml configuration, or a bad setting
EXIT_STALLED = 124  # no progress within the stall timeout (timeout(1)'s code for "timed out"; docs/resilience.md)
# No majority of the job's members answers this host: it may be the one cut off, so it stops its part and leaves a job
# that may go on without it.  128 + 75 (sysexits' EX_TEMPFAIL, "try again"), no signal's code: 128 or more, so that
# Kubernetes' training-operator under restartPolicy ExitCode makes the pod again (a code below 128 fails the whole
# job there, the majority's included), and the pod made again joins the job as a spare or hears its verdict.
EXIT_NO_MAJORITY = 203


class ToolkitError(Exception):
    """Base class: an error whose message is fit for the failure file."""

    exit_code = EXIT_INTERNAL


class ConfigError(ToolkitError):
    """A configuration file is missing, malformed, or inconsistent; or a setting's value is bad."""

    exit_code = EXIT_CONFIG

    def __init__(self, source: str, field: str | None, problem: str):
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: {_printable(field)}" if field else source
        super().__init__(f"{where}: {_printable(problem)}")


def _printable(text: str) -> str:
    """A field name or problem from user input may hold newlines: keep the message one line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


class CodeError(ToolkitError):
    """The user's code could not be fetched, unpacked, installed or found."""

    exit_code = EXIT_CODE_ERROR


class ClusterError(ToolkitError):
    """Hosts could not find each other, or the job failed on another host."""

    exit_code = EXIT_CLUSTER_ERROR


class NoMajority(ClusterError):
    """No majority of the job's members answers this host (``agent/succession.py``): it may be the one cut off."""

    exit_code = EXIT_NO_MAJORITY


class Interrupted(ClusterError):
    """The agent stopped a join or a wait for the go (a stopping signal during setup): not the channel's failure."""


class LeadLost(ClusterError):
    """A follower lost its lead (its link closed, or it went silent) while it waited for the lead's word."""

    def __init__(self, message: str, lead: str):
        super().__init__(message)
        self.lead = lead


class JobFailed(ClusterError):
    """The job failed on some host; ``reason`` names it, ``exit_code`` is the job's verdict (``summary``: the lead's
    summary line of the job's cost, which its verdict carried)."""

    def __init__(self, reason: str, exit_code: int, summary: str | None = None):
        self.exit_code = exit_code
        self.summary = summary
        super().__init__(reason)
