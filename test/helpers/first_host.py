"""The first host's side of a real channel, for tests without an agent: what its server posts, decided as the agent does.

The server decides nothing (docs/architecture.md): it posts joins, readiness, losses and failure
reports; the agent notes each in its roll (``agent.barrier.note``) and decides each barrier
(``agent.barrier.decide``) on them and on the passing of time.  ``FirstHost`` runs those same
pure functions over a real ``ControlServer``'s queue, so a test of the channel checks the
barrier's verdicts end to end.
"""

from __future__ import annotations

import time
from collections import deque
from queue import Empty, SimpleQueue

from training_toolkit.agent.barrier import Barrier, Failed, Passed, Roll, decide, note, opened
from training_toolkit.cluster.events import PeerJoined, PeerReady
from training_toolkit.cluster.server import ControlServer
from training_toolkit.core.errors import JobFailed


class FirstHost:
    def __init__(self, srv: ControlServer, events: SimpleQueue, attempt: int = 0):
        self.srv, self.events = srv, events
        self.first = srv.hosts[0] if srv.hosts else "m"
        self.attempt = attempt  # the channel's attempt (``state.channel_attempt`` in the agent)
        self.roll = Roll()
        self.why: dict[str, str] = {}  # after a barrier: why each lost host was lost
        self._seen: deque = deque()  # what a barrier read and noted besides joins and readiness, for ``get``

    def _note(self, event) -> None:
        self.roll = note(self.roll, event, time.monotonic(), self.attempt)

    def get(self, timeout: float = 5.0):
        """The next event that is not a join or a readiness (those are noted, as the agent notes them)."""
        if self._seen:
            return self._seen.popleft()
        end = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(0.0, end - time.monotonic()))
            self._note(event)
            if not isinstance(event, (PeerJoined, PeerReady)):
                return event

    def restart(self, attempt: int, reason: str) -> None:
        self.srv.restart(attempt, reason)
        self.attempt = attempt

    def wait_ready(self, deadline_s: float, alive_only: bool = False) -> frozenset[str]:
        """The barrier of the current attempt: the hosts ready, or a JobFailed with the agent's reason."""
        self.roll = opened(self.roll, self.attempt)
        barrier = Barrier(self.attempt, tuple(self.srv.expected), time.monotonic() + deadline_s, deadline_s,
                          alive_only)
        while True:
            outcome = decide(self.first, self.roll, barrier, time.monotonic())
            if isinstance(outcome, Passed):
                self.why = dict(outcome.why)
                return outcome.ready
            if isinstance(outcome, Failed):
                raise JobFailed(outcome.outcome.reason or "", outcome.outcome.exit_code)
            try:
                event = self.events.get(timeout=max(0.0, outcome.until - time.monotonic()))
            except Empty:
                continue
            self._note(event)
            if not isinstance(event, (PeerJoined, PeerReady)):
                self._seen.append(event)
