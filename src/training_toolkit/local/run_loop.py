"""The one run loop of both local launchers: wait for every host's ``train``, and stop them all when it is time.

Hosts in namespaces (``launcher.py``) and in containers (``container_launcher.py``)
differ in how a host is made, watched and stopped; when to stop and how long a stop
may take are the same for both, and written here once:

- SIGINT/SIGTERM to the launcher, the deadline (``--timeout``), or, with
  ``abort_on_exit`` (SageMaker's local mode), the first host to end: every host still
  running is stopped;
- a stop is SIGTERM to every host's ``train``, which passes it to its ranks and waits
  its own grace period (``TRAINING_TOOLKIT_GRACE_PERIOD``, which the launchers set to
  ``--stop-grace``), then SIGKILL ``STOP_MARGIN_S`` later for what is left, so that
  ``train`` has time to end its ranks and write its verdict first.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

from training_toolkit.core.log import log

#: Seconds a local job may run before it is stopped (``--timeout``).
DEFAULT_TIMEOUT_S = 3600.0
#: Seconds a host's ``train`` has to stop its ranks once asked (``--stop-grace``).
DEFAULT_STOP_GRACE_S = 10.0
#: What a stop adds to the grace before SIGKILL, so ``train`` can kill its ranks and write its verdict.
STOP_MARGIN_S = 5.0
#: The variable that gives each host's ``train`` the launcher's grace period.
GRACE_VARIABLE = "TRAINING_TOOLKIT_GRACE_PERIOD"

_POLL_S = 0.02


class Hosts(Protocol):
    """The running hosts of one job, as a launcher watches and stops them."""

    def ended(self) -> Mapping[str, float]:
        """The hosts whose ``train`` has ended so far, with when (``time.monotonic()``)."""
        ...

    def stop(self, kill_after_s: float) -> None:
        """SIGTERM to every host still running, SIGKILL after ``kill_after_s``; returns once all have ended."""
        ...


def grace_environment(stop_grace_s: float) -> dict[str, str]:
    """What each host's ``train`` is given so that its own grace is the launcher's."""
    return {GRACE_VARIABLE: str(int(stop_grace_s)) if float(stop_grace_s).is_integer() else str(stop_grace_s)}


def kill_after(stop_grace_s: float) -> float:
    """Seconds from a stop's SIGTERM to its SIGKILL."""
    return stop_grace_s + STOP_MARGIN_S


def run(hosts: Hosts, count: int, stop: threading.Event, *, timeout_s: float, stop_grace_s: float,
        abort_on_exit: bool = False) -> str | None:
    """Wait until all ``count`` hosts have ended, or stop them; why they were stopped (None: they all ended)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ended = hosts.ended()
        if len(ended) >= count:
            return None
        if stop.is_set():
            why = "interrupted"
        elif time.monotonic() >= deadline:
            why = f"timed out after {timeout_s:g} s"
        elif abort_on_exit and ended:
            why = f"{min(ended, key=ended.__getitem__)} exited (abort on exit)"
        else:
            stop.wait(_POLL_S)
            continue
        log(f"local: {why}: stopping the hosts ({stop_grace_s:g} s grace)")
        hosts.stop(kill_after(stop_grace_s))
        return why


@contextmanager
def stopped_by_signals(stop: threading.Event) -> Iterator[threading.Event]:
    """SIGINT and SIGTERM to the launcher set ``stop`` while in the block (in the main thread only)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda _signum, _frame: stop.set())
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
