"""Who takes part in each attempt (agent/roster.py): every rule a row."""

import pytest

from training_toolkit.agent.roster import (Roster, Shortfall, Turn, attempt_line, elastic, first_roster, joined, limits,
                                     next_roster, to_retire)

H = ("algo-1", "algo-2", "algo-3", "algo-4", "algo-5")


def alive(*down):
    return frozenset(h for h in H if h not in down)


def test_the_first_roster_is_the_platforms_first_hosts_the_rest_spares():
    assert first_roster(H, None) == Roster(H)
    assert first_roster(H, 3) == Roster(H[:3], H[3:])
    assert first_roster(H, 9) == Roster(H)


@pytest.mark.parametrize("last, down, kw, want", [
    # nothing lost: the same roster, no change
    (Roster(H[:3], H[3:]), (), {}, Turn(Roster(H[:3], H[3:]))),
    # a lost host's seat goes to the first spare: the survivors keep their ranks
    (Roster(H[:3], H[3:]), ("algo-2",), {}, Turn(Roster(("algo-1", "algo-4", "algo-3"), ("algo-5",)),
                                                 ("algo-2 lost; algo-4 takes its place",))),
    # two lost, two spares, in order
    (Roster(H[:3], H[3:]), ("algo-2", "algo-3"), {},
     Turn(Roster(("algo-1", "algo-4", "algo-5")),
          ("algo-2 lost; algo-4 takes its place", "algo-3 lost; algo-5 takes its place"))),
    # a spare that is down is skipped
    (Roster(H[:3], H[3:]), ("algo-2", "algo-4"), {}, Turn(Roster(("algo-1", "algo-5", "algo-3")),
                                                         ("algo-2 lost; algo-5 takes its place",))),
    # no spare and no minimum: the job cannot go on
    (Roster(H[:3]), ("algo-3",), {}, Shortfall(("algo-3",), ("algo-1", "algo-2"), 3)),
    # no spare, a minimum of 2: the survivors go on, renumbered in their order
    (Roster(H[:3]), ("algo-2",), {"min_hosts": 2}, Turn(Roster(("algo-1", "algo-3")), ("algo-2 lost",))),
    # below the minimum
    (Roster(H[:3]), ("algo-2", "algo-3"), {"min_hosts": 2}, Shortfall(("algo-2", "algo-3"), ("algo-1",), 2)),
    # shrunk earlier, a host back as a spare: seated at this restart, at the end, up to the maximum
    (Roster(("algo-1", "algo-3"), ("algo-2",)), (), {"max_hosts": 3, "min_hosts": 2},
     Turn(Roster(("algo-1", "algo-3", "algo-2")), ("algo-2 seated",))),
    # never beyond the maximum
    (Roster(("algo-1", "algo-3"), ("algo-2", "algo-4")), (), {"max_hosts": 3},
     Turn(Roster(("algo-1", "algo-3", "algo-2"), ("algo-4",)), ("algo-2 seated",))),
    # a host failing twice gives its seat to a waiting spare, and is never called again
    (Roster(H[:3], H[3:]), (), {"retire": frozenset({"algo-3"})},
     Turn(Roster(("algo-1", "algo-2", "algo-4"), ("algo-5",), ("algo-3",)),
          ("algo-3 retired after 2 failures; algo-4 takes its place",))),
    # ... but keeps it with no spare waiting
    (Roster(H[:3]), (), {"retire": frozenset({"algo-3"})}, Turn(Roster(H[:3]))),
    # the first host is never retired (it holds the channel)
    (Roster(H[:3], H[3:]), (), {"retire": frozenset({"algo-1"})}, Turn(Roster(H[:3], H[3:]))),
    # the reason a host was lost goes into the line
    (Roster(H[:2], H[2:3]), ("algo-2",), {"why": {"algo-2": "no answer for 10 s"}},
     Turn(Roster(("algo-1", "algo-3")), ("algo-2 lost: no answer for 10 s; algo-3 takes its place",))),
])
def test_the_next_roster(last, down, kw, want):
    assert next_roster(last, alive(*down), **kw) == want


def test_a_retired_host_is_not_seated_again():
    turn = next_roster(Roster(H[:3], H[3:4]), alive(), retire=frozenset({"algo-3"}))
    assert turn.roster == Roster(("algo-1", "algo-2", "algo-4"), (), ("algo-3",))
    again = next_roster(turn.roster, alive("algo-2"), min_hosts=2)
    assert again.roster == Roster(("algo-1", "algo-4"), (), ("algo-3",))
    assert joined(again.roster, "algo-3") == again.roster  # retired: not a spare again
    assert joined(again.roster, "algo-2") == Roster(("algo-1", "algo-4"), ("algo-2",), ("algo-3",))  # back: a spare
    assert joined(joined(again.roster, "algo-2"), "algo-2") == Roster(("algo-1", "algo-4"), ("algo-2",), ("algo-3",))


@pytest.mark.parametrize("causes, want", [
    ((), frozenset()),
    (("algo-3",), frozenset()),
    (("algo-3", "algo-3"), {"algo-3"}),
    (("algo-2", "algo-3", "algo-3"), {"algo-3"}),
    (("algo-3", "algo-2"), frozenset()),
    (("algo-3", None, "algo-3"), frozenset()),  # a stall between breaks the run
    ((None, None), frozenset()),
])
def test_a_host_is_retired_after_two_failures_of_its_own_in_a_row(causes, want):
    assert to_retire(causes) == frozenset(want)


def test_the_attempts_line_names_its_membership():
    turn = next_roster(Roster(("algo-1", "algo-2", "algo-3"), ("algo-5",)), alive("algo-2"),
                       why={"algo-2": "no answer for 10 s"})
    assert attempt_line(2, 4, turn) == ("attempt 2 of 4: algo-1, algo-5, algo-3 "
                                        "(algo-2 lost: no answer for 10 s; algo-5 takes its place)")
    assert attempt_line(1, 1, Turn(Roster(H[:2]))) == "attempt 1 of 1: algo-1, algo-2"
    assert attempt_line(1, 2, Turn(Roster(H[:2], H[2:3]))) == "attempt 1 of 2: algo-1, algo-2 (spares: algo-3)"


@pytest.mark.parametrize("hosts, max_hosts, min_hosts, want", [
    (4, None, None, (4, 4)),  # the defaults: every host, and a lost host without a spare ends the job
    (4, 3, None, (3, 3)),  # one spare
    (3, None, 2, (3, 2)),  # may shrink to 2
    (4, 3, 2, (3, 2)),
    (1, None, None, (1, 1)),
])
def test_the_limits(hosts, max_hosts, min_hosts, want):
    assert limits(hosts, max_hosts, min_hosts) == want


@pytest.mark.parametrize("hosts, max_hosts, min_hosts, said", [
    (3, 4, None, "TRAINING_TOOLKIT_MAX_HOSTS=4 is more than the job's 3 host(s)"),
    (4, 2, 3, "TRAINING_TOOLKIT_MIN_HOSTS=3 is more than TRAINING_TOOLKIT_MAX_HOSTS=2"),
    (3, None, 4, "TRAINING_TOOLKIT_MIN_HOSTS=4 is more than TRAINING_TOOLKIT_MAX_HOSTS=3 (all 3 hosts)"),
])
def test_limits_out_of_order_are_named(hosts, max_hosts, min_hosts, said):
    with pytest.raises(ValueError) as exc:
        limits(hosts, max_hosts, min_hosts)
    assert str(exc.value) == said


@pytest.mark.parametrize("hosts, max_hosts, min_hosts, want", [
    (4, 4, 4, False), (4, 3, 3, True), (3, 3, 2, True), (1, 1, 1, False)])
def test_elastic_when_spares_or_a_minimum_below_the_maximum(hosts, max_hosts, min_hosts, want):
    assert elastic(hosts, max_hosts, min_hosts) is want
