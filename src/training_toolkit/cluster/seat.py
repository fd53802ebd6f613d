"""What an agent needs of its seat in the job, whatever its role: ``Membership`` (cluster/membership.py), the seat of a
job of one host (``agent.seats.SoloSeat``), or a test's fake.  An interface only: it imports none of the channel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from training_toolkit.cluster.events import Verdict
    from training_toolkit.job.attempt import Attempt


class Seat(Protocol):
    """What an agent needs of its seat: ``Membership``, or a test's fake.

    ``hosts``: after ``open``, the job's hosts in rank order as the lead gave them (its own on the lead).
    """

    is_lead: bool
    hosts: tuple[str, ...]

    @property
    def job_id(self) -> str: ...

    @property
    def introductions(self) -> Mapping[str, Mapping[str, str]]: ...

    @property
    def job_attempt(self) -> tuple[int, bool]: ...

    def open(self) -> None: ...

    def barrier(self, attempt: int = 0, deadline_s: float | None = None) -> Attempt: ...

    def release(self, attempt: Attempt) -> None: ...

    def report_failure(self, reason: str, exit_code: int, at: float | None = None, attempt: int = 0,
                       stopped: bool = False) -> None: ...

    def restart(self, attempt: int, reason: str, cause: str | None = None) -> None: ...

    def progress(self, heartbeat: bool, checkpoint: bool = False) -> None: ...

    def share_mark(self, host: str, attempt: int) -> None: ...

    def request_stacks(self, timeout_s: float) -> Mapping[str, object]: ...

    def send_stacks(self, stacks: list) -> None: ...

    def report_done(self, exit_code: int) -> None: ...

    def fail(self, reason: str, exit_code: int, at: float | None = None) -> None: ...

    def announce(self, verdict: Verdict, linger: bool = True) -> None: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...
