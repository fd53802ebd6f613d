"""Finding the job under another lead: a host back after its loss, whose platform's first host does not lead.

A returning host cannot know who leads now.  The first members left lead after a loss, in the platform's
order (``agent/succession.py``), so it asks the next hosts after the platform's first, each once, whether
one of them leads a job that has started; at a job's start none of them serves, so each question is a
refused connection, at once (``PROBE_S`` bounds one whose address drops it).  The platform's first host
asks once its own channel is open; any other host when the first host has not answered for ``LOOK_S``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training_toolkit.cluster.client import ControlClient

PROBED_SUCCESSORS = 3
PROBE_S = 0.5
LOOK_S = 5.0


def running_job(client_for: Callable[[str], ControlClient], hosts: Sequence[str],
                first_attempt: int) -> ControlClient | None:
    """The first of ``hosts`` (the first ``PROBED_SUCCESSORS``) that leads a job that has started, joined (its client,
    from ``client_for``); None if none does."""
    for host in hosts[:PROBED_SUCCESSORS]:
        client = client_for(host)
        if not client.try_join(PROBE_S):
            continue
        if client.job_attempt[0] > first_attempt or client.job_attempt[1]:
            return client
        client.close()
    return None
