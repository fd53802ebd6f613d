"""Finding the job under another lead: a host back after its loss, whose platform's first host does not lead.

A returning host cannot know who leads now: after any number of the lead's losses it may be any host.
So it asks every other host whether it leads a job that has started, ``PROBES_AT_ONCE`` of them side by
side, each once, and follows the first in the platform's order that does (the first members left lead
after a loss, ``agent/succession.py``).  At a job's start none of them serves, so each question is a
refused connection, at once, and they are asked at the same time (``PROBE_S`` bounds one whose address
drops it).  The platform's first host asks once its own channel is open; any other host when the first
host has not answered for ``LOOK_S``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training_toolkit.cluster.client import ControlClient

PROBES_AT_ONCE = 16  # hosts asked side by side: a look costs at most PROBE_S per this many hosts
PROBE_S = 0.5
LOOK_S = 5.0


def running_job(client_for: Callable[[str], ControlClient], hosts: Sequence[str],
                first_attempt: int) -> ControlClient | None:
    """The first of ``hosts``, in their order, that leads a job that has started, joined (its client, from
    ``client_for``); None if none does.  Every host is asked, ``PROBES_AT_ONCE`` at a time."""
    def ask(answers: list[ControlClient | None], index: int, host: str) -> None:
        answers[index] = _leading(client_for(host), first_attempt)

    for start in range(0, len(hosts), PROBES_AT_ONCE):
        batch = hosts[start:start + PROBES_AT_ONCE]
        answers: list[ControlClient | None] = [None] * len(batch)
        askers = [threading.Thread(target=ask, args=(answers, index, host), name=f"look-{host}", daemon=True)
                  for index, host in enumerate(batch)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join()  # each bounded: PROBE_S to connect, the join's own deadline for the handshake
        leads = [client for client in answers if client is not None]
        for other in leads[1:]:  # two leads of a started job: never both (succession); the first in order holds
            other.close()
        if leads:
            return leads[0]
    return None


def _leading(client: ControlClient, first_attempt: int) -> ControlClient | None:
    """``client``, joined, if its host leads a job that has started; else None (closed if it joined)."""
    if not client.try_join(PROBE_S):
        return None
    if client.job_attempt[0] > first_attempt or client.job_attempt[1]:
        return client
    client.close()
    return None


def look_for(client_for: Callable[[str], ControlClient], hosts: Sequence[str], first_attempt: int, window_s: float,
             stopped: threading.Event) -> ControlClient | None:
    """``running_job`` asked again every ``LOOK_S`` for ``window_s`` (a host out of the job, which may be the one cut
    off: the cut may mend), or until ``stopped`` is set; the lead found, joined, or None."""
    import time

    end = time.monotonic() + window_s
    while not stopped.is_set():
        found = running_job(client_for, hosts, first_attempt)
        left = end - time.monotonic()
        if found is not None or left <= 0:
            return found
        stopped.wait(min(LOOK_S, left))
    return None
