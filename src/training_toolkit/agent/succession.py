"""Who leads when the lead is lost, and when a host may lead at all: the one rule, written once (pure).

The job's *members* are the last attempt's active hosts and spares (``Attempt``): the hosts it
counts on for the next.  A host may lead an attempt only with a **majority** of the members
behind it, itself included: a lead cut off from the others (a cut cable, not a death) cannot
gather one and stops, so two attempts never run side by side.  When the lead is lost, the
survivors take as the next lead **the first member in the platform's order** that is not known
lost; a follower that cannot reach it within the wait takes the one after, and so does one whose next lead
is lost in turn before its go (a second loss during the new lead's first barrier).  The k-th successor is
waited for k + 1 waits (``waits``): it may itself be trying the k before it.  The attempt number
is the term: a host follows only a lead of an attempt newer than any it has run.  The k-th successor leads
the k-th attempt after the lost lead's (``term``), whoever asks it: a host that passed over the ones before it
asks for the same attempt as one that saw them lost after their go, even one that started the attempt of a
next lead lost in turn (its go reached some hosts and not others).

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


def waits(order: Sequence[str], members: Iterable[str], lost: str, host: str) -> int:
    """How many failover waits ``host`` may take to lead after ``lost`` (the lead every member saw lost): the k-th
    successor leads only once the k before it failed to answer, each within a wait (it cannot know that one was
    lost after ``lost``, as a follower that saw it go can), so the k-th is given k + 1: to answer, and its first
    barrier to gather the others, who may have tried the same dead ones first."""
    return successors(order, members, (lost,)).index(host) + 1


def term(order: Sequence[str], members: Iterable[str], lost: str, host: str, first: int) -> int:
    """The attempt ``host`` leads after ``lost`` (the lead every member saw lost), ``first`` the attempt the members
    fail over to: one more for each member before ``host`` (each one a lead that may have started its attempt on
    some hosts before it was lost), so that every host asks each candidate for the same attempt."""
    return first + waits(order, members, lost, host) - 1
