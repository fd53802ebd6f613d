"""Who leads when the lead is lost, and when a host may lead at all: the one rule, written once (pure).

The job's *members* are the last attempt's active hosts and spares (``Attempt``): the hosts it
counts on for the next.  A host may lead an attempt only with a **majority** of the members
behind it, itself included: a lead cut off from the others (a cut cable, not a death) cannot
gather one and stops, so two attempts never run side by side.  When the lead is lost, the
survivors take as the next lead **the first member in the platform's order** that is not known
lost; a follower that cannot reach it within the wait takes the one after.  The attempt number
is the term: a host follows only a lead of an attempt newer than any it has run.

What the rule cannot do: with two members (two hosts and no spare) a survivor alone is no
majority, so it cannot tell a dead lead from a cut cable, and the job ends as it did before
failover, named (docs/resilience.md, "When the lead is lost").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def majority(members: Iterable[str]) -> int:
    """How many of ``members`` are a majority: more than half."""
    return len(set(members)) // 2 + 1


def has_majority(behind: Iterable[str], members: Iterable[str]) -> bool:
    """``behind`` (the hosts ready for a lead, itself included) are a majority of ``members``."""
    members = set(members)
    return len(set(behind) & members) >= majority(members)


def may_go_on(members: Iterable[str], lost: Iterable[str]) -> bool:
    """The members left once ``lost`` are gone are still a majority: a new lead may gather them."""
    members = set(members)
    return has_majority(members - set(lost), members)


def successors(order: Sequence[str], members: Iterable[str], lost: Iterable[str]) -> tuple[str, ...]:
    """The hosts that may lead next, in the order they are tried: the members not lost, in the platform's order."""
    members, lost = set(members), set(lost)
    return tuple(host for host in order if host in members and host not in lost)
