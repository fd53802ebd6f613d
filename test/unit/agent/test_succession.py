"""No host is special: who leads when the lead is lost, and when a host may lead at all, as exact tables.

The rule (``agent/succession.py``), the roster after a lost lead (``roster.led_by``), a follower's
decisions when its lead is lost (``follow.py``), and a new lead's first barrier (``agent/barrier.py``).
No processes, sockets or root: the real failover runs in test/integration/test_spares.py.
"""

from __future__ import annotations

import pytest

from helpers.steps import run
from training_toolkit.agent.barrier import Barrier, Failed, Passed, Roll, Waiting, decide
from training_toolkit.agent.decisions import (FailOver, Finish, GotSignal, PartEnded, Phase, Rejoin, Started, StopPart,
                                              follower_state, promoted, step, toward)
from training_toolkit.agent.succession import has_majority, majority, may_go_on, successors, term, waits
from training_toolkit.cluster.events import PeerLost, RestartCalled
from training_toolkit.job.report import Outcome
from training_toolkit.agent.roster import Roster, led_by, next_roster

H4 = ("algo-1", "algo-2", "algo-3", "algo-4")


@pytest.mark.parametrize("members, want", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_a_majority_is_more_than_half(members, want):
    assert majority(H4[:members] if members <= 4 else (*H4, "algo-5")) == want


def test_a_lead_needs_a_majority_of_the_members_itself_included():
    assert has_majority({"algo-2", "algo-3"}, H4[:3]) and not has_majority({"algo-1"}, H4[:3])
    assert not has_majority({"algo-2", "algo-3"}, H4)  # 2 of 4 is half, not more
    assert not has_majority({"algo-2", "algo-9"}, H4[:3])  # a host that is no member does not count
    assert may_go_on(H4[:3], {"algo-1"}) and not may_go_on(H4[:2], {"algo-1"})  # two members: the survivor alone
    assert may_go_on(H4, {"algo-1"}) and not may_go_on(H4, {"algo-1", "algo-2"})


def test_the_successors_are_the_members_left_in_the_platforms_order():
    assert successors(H4, ("algo-3", "algo-1", "algo-4"), {"algo-1"}) == ("algo-3", "algo-4")
    assert successors(H4, H4, {"algo-1", "algo-2"}) == ("algo-3", "algo-4")  # a successor that did not answer
    assert successors(H4, ("algo-2",), {"algo-2"}) == ()


def test_the_kth_successor_is_waited_for_k_plus_one_waits_counted_from_the_lead_every_member_saw_lost():
    H5 = (*H4, "algo-5")
    assert [waits(H5, H5, "algo-1", host) for host in H5[1:]] == [1, 2, 3, 4]
    assert waits(H5, ("algo-1", "algo-3", "algo-5"), "algo-1", "algo-5") == 2  # members only: algo-3 before it
    with pytest.raises(ValueError):
        waits(H5, H5, "algo-1", "algo-1")  # the lost lead is nobody's successor


def test_the_kth_successor_leads_the_kth_attempt_after_the_lost_leads_whoever_asks_it():
    """algo-1 lost in attempt 0 (every member fails over to attempt 1).  algo-2 then lost with its go sent to algo-4
    and algo-5 only: they fail over from attempt 1 (to 2, their members attempt 1's, algo-1 not among them); algo-3,
    which never had the go, passes algo-2 over: both ask algo-3 for attempt 2, and algo-4 for 3."""
    H5 = (*H4, "algo-5")
    assert [term(H5, H5, "algo-1", host, 1) for host in H5[1:]] == [1, 2, 3, 4]
    started = H5[1:]  # algo-2's go: its members
    assert [term(H5, started, "algo-2", host, 2) for host in ("algo-3", "algo-4")] == [2, 3]
    assert [term(H5, H5, "algo-1", host, 1) for host in ("algo-3", "algo-4")] == [2, 3]  # algo-3's own view: the same


def test_a_host_on_its_way_to_an_attempt_never_goes_back():
    state = follower_state("algo-3", 3)
    assert toward(state, 2).attempt == 2 and toward(toward(state, 2), 1).attempt == 2 and toward(state, 0) == state


def test_a_next_leads_attempt_past_the_restarts_allowed_ends_the_job_named():
    from types import SimpleNamespace

    from training_toolkit.agent import meeting
    from training_toolkit.core.errors import ClusterError

    agent = SimpleNamespace(host="algo-4", state=follower_state("algo-4", 2, first_attempt=1))
    meeting._toward(agent, 3, "algo-1")  # the platform started the job at attempt 1: 2 restarts take it to 3
    assert agent.state.attempt == 3
    with pytest.raises(ClusterError, match=r"^algo-4: no restart left to lead the job on after algo-1 was lost "
                                           r"\(attempt 5, past the 2 restarts allowed\)$"):
        meeting._toward(agent, 4, "algo-1")
    assert agent.state.attempt == 3


@pytest.mark.parametrize("last, lead, alive, want", [
    # the new lead takes rank 0; its old seat is the lost lead's, where the spare sits; the others keep theirs
    (Roster(("algo-1", "algo-2", "algo-3"), ("algo-4",)), "algo-2", H4[1:], Roster(("algo-2", "algo-4", "algo-3"))),
    # no spare: the job shrinks, the hosts after the new lead's old seat keep their order
    (Roster(("algo-1", "algo-2", "algo-3")), "algo-3", {"algo-2", "algo-3"}, Roster(("algo-3", "algo-2"))),
    # a spare leads (every active host but the lead was lost too): it takes rank 0
    (Roster(("algo-1", "algo-2"), ("algo-3", "algo-4")), "algo-3", {"algo-2", "algo-3", "algo-4"},
     Roster(("algo-3", "algo-2"), ("algo-4",))),
])
def test_the_roster_after_a_lost_lead(last, lead, alive, want):
    turn = next_roster(led_by(last, lead), frozenset(alive), min_hosts=1)
    assert turn.roster == want


def follower(max_restarts=2, failover=True):
    return step(follower_state("algo-2", max_restarts=max_restarts), Started(("rank 1",), None, failover), 0.0)[0]


def test_a_follower_that_loses_its_lead_stops_its_part_then_looks_for_the_next_lead():
    state, actions = run(follower(), (5.0, PeerLost("algo-1", "lost the lead algo-1 (timed out)")))
    assert actions == [StopPart(0)] and state.phase == Phase.STOPPING and state.lead_lost == "algo-1"
    state, actions = run(state, (5.0, PeerLost("algo-1", "again")))  # the same loss told twice: nothing more
    assert actions == []
    state, actions = run(state, (6.0, PartEnded(0)))
    assert actions == [FailOver(1, "algo-2: lost the lead algo-1 (timed out)", "algo-1")]
    assert state.phase == Phase.BARRIER and state.attempt == 1


def test_a_follower_stopping_for_a_restart_when_its_lead_is_lost_meets_the_next_lead_for_that_restart():
    stopping, _ = step(follower(), RestartCalled(1, "algo-3 rank 2: boom"), 1.0)
    state, actions = run(stopping, (2.0, PeerLost("algo-1", "lost the lead algo-1 (closed)")), (3.0, PartEnded(0)))
    assert actions == [FailOver(1, "algo-3 rank 2: boom", "algo-1")]


def test_a_follower_keeps_whose_ranks_caused_each_restart_and_a_lost_lead_as_no_ones():
    restarted, _ = step(follower(), RestartCalled(1, "algo-3 rank 2: boom", "algo-3"), 1.0)
    assert restarted.cause_hosts == ("algo-3",)  # should it lead later, the retire rule counts it
    lost, _ = step(restarted, PeerLost("algo-1", "closed"), 2.0)
    assert lost.cause_hosts == ("algo-3",)  # that same restart, under the next lead: not a failure of its own
    lead_lost, _ = step(follower(), PeerLost("algo-1", "closed"), 2.0)
    assert lead_lost.cause_hosts == (None,)  # the lead's loss: no one host's ranks (it breaks a run)


@pytest.mark.parametrize("state", [
    follower(failover=False),  # too few members, a runner whose lead is fixed (MPI), no spares nor minimum
    follower(max_restarts=0),  # no restart left: the lead's loss is the job's end
    step(follower(), GotSignal(15), 1.0)[0],  # stopped: never a restart
], ids=["no-failover", "no-restart-left", "stopped"])
def test_a_follower_that_cannot_fail_over_ends_as_before_named(state):
    state, actions = run(state, (5.0, PeerLost("algo-1", "lost the lead algo-1 (timed out)")))
    assert actions[-1] == Finish(Outcome(69, "algo-2: lost the lead algo-1 (timed out)"))


def test_a_restart_without_a_lost_lead_is_the_usual_rejoin():
    stopping, _ = step(follower(), RestartCalled(1, "x"), 1.0)
    assert run(stopping, (2.0, PartEnded(0)))[1] == [Rejoin(1, "x")]


def test_a_promoted_follower_keeps_what_the_job_learnt_and_starts_a_leads_own_afresh():
    state, _ = run(follower(), (5.0, PeerLost("algo-1", "lost the lead algo-1")), (6.0, PartEnded(0)))
    lead = promoted(state, ("algo-1", "algo-3", "algo-4"), wait_for_peers=True)
    assert lead.is_lead and lead.attempt == 1 and lead.causes == state.causes and lead.max_restarts == 2
    assert lead.lead.workers == {"algo-1", "algo-3", "algo-4"} and lead.lead.wait_for_peers
    assert lead.lead_lost is None and not lead.failover


H5 = (*H4, "algo-5")


def new_lead_barrier(ready, members=H4, now=0.0, needed=0):
    """algo-2's first barrier as the lead after algo-1: it waits for the other members left (and ``needed`` hosts)."""
    roll = Roll(frozenset(ready), frozenset(ready), {h: 1 for h in ready})
    expected = tuple(h for h in members if h not in ("algo-1", "algo-2"))
    return decide("algo-2", roll, Barrier(1, expected, 13.0, 13.0, members=members, needed=needed), now)


def test_a_new_leads_barrier_seats_a_host_that_came_back_and_waits_for_the_jobs_minimum():
    # members algo-1, algo-2, algo-4 (algo-3 lost earlier; back since, a spare that is no member); the job needs 3
    members = ("algo-1", "algo-2", "algo-4")
    assert new_lead_barrier(("algo-4",), members, now=1.0, needed=3) == Waiting(13.0)  # 2 of the 3 needed: it waits
    assert new_lead_barrier(("algo-4", "algo-3"), members, now=2.0, needed=3) == Passed(
        frozenset({"algo-2", "algo-3", "algo-4"}), {})  # the host back counts, though no member
    # at the deadline with fewer than needed: the majority rule as before (the roster then names the shortfall)
    assert new_lead_barrier(("algo-4",), members, now=13.0, needed=3) == Passed(frozenset({"algo-2", "algo-4"}), {})
    # the host back is no member: it makes no majority
    outcome = new_lead_barrier(("algo-3",), members, now=13.0, needed=3)
    assert isinstance(outcome, Failed) and "1 of its 3 members" in outcome.outcome.reason


def test_a_new_leads_barrier_passes_when_every_member_left_is_ready():
    assert new_lead_barrier(("algo-3", "algo-4")) == Passed(frozenset(H4[1:]), {})


def test_a_new_leads_barrier_waits_for_the_others_then_passes_with_a_majority():
    assert new_lead_barrier(("algo-3", "algo-4"), H5, now=5.0) == Waiting(13.0)  # algo-5 may still be stopping
    assert new_lead_barrier(("algo-3", "algo-4"), H5, now=13.0) == Passed(frozenset(H4[1:]), {})  # 3 of 5


def test_a_new_lead_without_a_majority_at_its_deadline_ends_the_job_named():
    outcome = new_lead_barrier(("algo-3",), now=13.0)  # itself and algo-3: 2 of the 4 members, half is not more
    assert isinstance(outcome, Failed) and outcome.outcome.exit_code == 203  # EXIT_NO_MAJORITY: a code to retry
    assert outcome.outcome.reason.startswith("algo-2: no majority to lead the job: 2 of its 4 members")


def seats_of(hosts, env, active=None):
    """A lead's ``Seats`` for ``hosts`` with the settings ``env``, its last attempt on ``active`` (None: every host)."""
    from pathlib import Path

    from training_toolkit.config import settings
    from training_toolkit.agent.seats import Seats
    from training_toolkit.job.attempt import seated
    from training_toolkit.core.hardware import Hardware
    from training_toolkit.job.spec import build_job
    from training_toolkit.core.paths import Paths
    from training_toolkit.job.plan import LaunchPlan
    from training_toolkit.runspec import RunContext, RunnerSpec

    job = build_job(Paths(Path("/nonexistent")), {}, {"current_host": hosts[0], "hosts": list(hosts)}, {}, {},
                    Hardware(1, 0, 0))
    ctx = RunContext(job, LaunchPlan("torch_distributed", tuple(hosts), hosts[0]), settings.parse(env), {}, {}, (),
                     Path("/nonexistent"), "python")
    seats = Seats(ctx, hosts)
    seats.take_limits(RunnerSpec(lambda seat: []))
    seats.attempt = seated(0, hosts, active)
    return seats


def test_a_lead_without_a_majority_stops_only_where_a_follower_could_lead():
    from training_toolkit.core.errors import NoMajority

    cut_off = frozenset({"algo-1"})  # the lead alone: cut off, or the others dead
    with pytest.raises(NoMajority, match="no majority to lead the job: 1 of its 3 members answer") as raised:
        seats_of(H4[:3], {"TRAINING_TOOLKIT_MIN_HOSTS": "1"}).next_choice(cut_off, {}, ())
    assert raised.value.exit_code == 203  # 128 or more: an operator's ExitCode policy makes the pod again
    # a spare and the default minimum (every seat): the lead cut off is short of hosts too, but says it may be cut off
    with pytest.raises(NoMajority, match="no majority to lead the job: 1 of its 4 members answer"):
        seats_of(H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3"}, active=H4[:3]).next_choice(cut_off, {}, ())
    # two hosts: the survivor alone would be no majority, so no follower leads; the lead shrinks as before
    assert seats_of(H4[:2], {"TRAINING_TOOLKIT_MIN_HOSTS": "1"}).next_choice(cut_off, {}, ()) == Roster(("algo-1",))
    # a majority behind it: it goes on
    assert seats_of(H4[:3], {"TRAINING_TOOLKIT_MIN_HOSTS": "1"}).next_choice(
        frozenset({"algo-1", "algo-3"}), {}, ()) == Roster(("algo-1", "algo-3"))


def test_a_new_lead_keeps_the_hosts_the_lost_lead_retired():
    from training_toolkit.job.attempt import Attempt

    seats = seats_of(H4, {"TRAINING_TOOLKIT_MIN_HOSTS": "2"})
    seats.attempt = Attempt(2, ("algo-1", "algo-2", "algo-3"), (), ("algo-4",), ("algo-4", "algo-4"))
    seats.host = "algo-2"
    seats.take_lead("algo-1")
    assert seats.roster == Roster(("algo-2", "algo-1", "algo-3"), (), ("algo-4",))  # retired still, not a spare
    # algo-1's seat, rank 1 now, is not given to algo-4: the job shrinks to its minimum instead
    assert seats.next_choice(frozenset({"algo-2", "algo-3", "algo-4"}), {}, ("algo-4", "algo-4", None)) == Roster(
        ("algo-2", "algo-3"), (), ("algo-4",))


def test_a_lead_lost_at_barrier_0_the_last_attempt_is_the_first_roster_every_host_computes_alike():
    """A member that never had the lost lead's go takes the attempt that go would have started (its barrier passes
    with every host ready: the first roster), as the hosts the go reached did; the next lead then takes the lost
    lead's seat in it, and the spare stays a spare."""
    seats = seats_of(H4, {"TRAINING_TOOLKIT_MAX_HOSTS": "3"})
    seats.host = "algo-2"
    seats.take_first_choice()
    assert (seats.attempt.number, seats.attempt.active, seats.attempt.spares) == (0, H4[:3], ("algo-4",))
    assert seats.members == H4 and seats.followers_may_lead()
    seats.take_lead("algo-1")
    assert seats.roster == Roster(("algo-2", "algo-1", "algo-3"), ("algo-4",))


@pytest.mark.parametrize("attempt, first, joined_running, why", [
    (0, 0, False, ""),
    (2, 2, False, "the platform restarted the job"),  # JobSet's restart-attempt
    (3, 0, True, "rejoining the job"),  # a host back in a job that went on
    (1, 0, False, "the lead was lost before the job started"),  # a member of barrier 0, its lead lost there
])
def test_why_this_trains_first_attempt_is_not_the_jobs_first(attempt, first, joined_running, why):
    from training_toolkit.agent.seats import why_this_attempt

    assert why_this_attempt(attempt, first, joined_running) == why
