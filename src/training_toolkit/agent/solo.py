"""The seat of a job of one host (the single runner): no channel, no port, nothing to tell anyone.

The agent runs the same phases and attempts on it; its barrier has no other
host to wait for (``agent.barrier`` passes it at once).  Kept in the agent, so
a single-host ``train`` imports no membership code (test/unit/test_launch_imports.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from queue import SimpleQueue


class SoloSeat:
    is_master = True
    job_id = ""
    introductions: Mapping[str, Mapping[str, str]] = {}
    job_attempt = (0, False)

    def __init__(self, secret: bytes | None, hosts: Sequence[str], current: str, settings: object,
                 events: SimpleQueue, introduction: Mapping[str, str] | None = None):
        self.current = current
        self.hosts = tuple(hosts)

    def open(self) -> None:
        pass

    def barrier(self, attempt: int = 0, deadline_s: float | None = None) -> tuple[str, ...]:
        return self.hosts

    def release(self, active: Sequence[str]) -> None:
        pass

    def report_failure(self, reason: str, exit_code: int, at: float | None = None, attempt: int = 0,
                       stopped: bool = False) -> None:
        pass

    def report_done(self, exit_code: int) -> None:
        pass

    def fail(self, reason: str, exit_code: int, at: float | None = None) -> None:
        pass

    def announce(self, verdict: object) -> None:
        pass

    def restart(self, attempt: int, reason: str) -> None:
        pass

    def progress(self, heartbeat: bool) -> None:
        pass

    def request_stacks(self, timeout_s: float) -> Mapping[str, object]:
        return {}

    def send_stacks(self, stacks: list) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass
