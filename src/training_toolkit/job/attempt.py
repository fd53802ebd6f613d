"""An attempt of the job, as its barrier decided it: one value, handed to everything that runs it.

Each barrier's outcome is an ``Attempt`` (torch's rendezvous hands its agent one
``RendezvousInfo`` the same way): its number, the active hosts in rank order and
the spares, and what the job has learnt up to it (the hosts retired, whose ranks caused each earlier
failure), which every host so knows should it lead the next.  The lead is the first active host: it holds the attempt's barrier
and verdict, and the runners put their coordinator there (mpirun and rank 0, the
chief, ``MASTER_ADDR``, MultiWorkerMirrored's worker 0).  What each rank sees
and everything that addresses or admits peers is computed from (job, attempt)
(``runspec.for_attempt``), never by feeding the hosts back through the job's
parser.

Words (docs/architecture.md, "Glossary"): the *lead* leads one attempt; the
*active* hosts run its ranks; a *spare* is joined and runs none; *the
platform's first host* is only a position in the platform's order of hosts.
"""

from __future__ import annotations

from collections.abc import Sequence

from training_toolkit.core.records import record


#: How many earlier failures' causes an attempt carries, the last ones: the retire rule reads two (``roster``).
MAX_CAUSES = 16


@record
class Attempt:
    """One attempt of the job: ``number`` (from the platform's first attempt on), its hosts, as every host takes them."""

    number: int
    active: tuple[str, ...]  # rank order, the lead first
    spares: tuple[str, ...] = ()  # joined, running nothing this attempt, in the order they are called
    # what the job has learnt, as its lead knew it at this attempt's go, so that a next lead knows it too:
    retired: tuple[str, ...] = ()  # hosts the lead retired (their ranks failed in a row: ``roster.to_retire``)
    causes: tuple[str | None, ...] = ()  # whose own ranks caused the last earlier failures (None: no one host's;
    #   at most MAX_CAUSES, oldest first)

    @property
    def lead(self) -> str:
        """The host that leads the attempt: rank order's first (one rule: every runner's coordinator is there)."""
        return self.active[0]

    def leads(self, host: str) -> bool:
        return host == self.active[0]

    def runs_on(self, host: str) -> bool:
        """``host`` has a part in the attempt (else it is a spare, or not of the job)."""
        return host in self.active


def seated(number: int, hosts: Sequence[str], active: Sequence[str] | None = None) -> Attempt:
    """The attempt ``number`` of a job of ``hosts`` (its every host, in the order the lead gave them) on ``active``
    (None: every host, as before any barrier chose), the others its spares."""
    active = tuple(active or hosts)
    return Attempt(number, active, tuple(host for host in hosts if host not in active))
