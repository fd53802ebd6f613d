"""The first host's barrier, decided in the pure step on what the channel's server posts: exact tables.

The server decides nothing; joins, readiness, losses and failure reports come as events, time as Ticks.
"""

from __future__ import annotations

import signal

import pytest

from helpers.steps import run
from training_toolkit.agent import barrier, failures, lead
from training_toolkit.agent.barrier import Barrier, Failed, Heard, Passed, Roll, Waiting, decide, note, not_ready
from training_toolkit.agent.decisions import (FAILURE_WINDOW_S, Announce, BarrierOpened, Finish, GotSignal, Interrupt,
                                              Release, Tick, lead_state, next_deadline, step)
from training_toolkit.agent.events import Phase
from training_toolkit.agent.state import led
from training_toolkit.cluster.events import PeerFailed, PeerJoined, PeerLost, PeerReady, Verdict
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR
from training_toolkit.core.records import replace
from training_toolkit.job.report import Outcome

HOSTS = ("algo-1", "algo-2", "algo-3")
TERM = int(signal.SIGTERM)



def master(roll=None, **kw):
    state = replace(lead_state("algo-1", HOSTS[1:]), **kw)
    return state if roll is None else led(state, roll=roll)


def joined_ready(*hosts, attempt=0):
    return [e for h in hosts for e in (PeerJoined(h), PeerReady(h, attempt))]


def told(outcome):
    return [Announce(Verdict(outcome.exit_code, outcome.reason, "algo-1")), Finish(outcome)]


# The pure rule: decide(first, roll, barrier, now) -----------------------------------------------------------------

GATE = Barrier(0, HOSTS[1:], deadline=10.0, deadline_s=10.0)
BOTH = Roll(frozenset(HOSTS[1:]), frozenset(HOSTS[1:]), {"algo-2": 0, "algo-3": 0})
LOSS = Heard(failures.lost("algo-3", "timed out", 4.0), 0, 5.0, loss=True)
CAUSE = Heard(failures.peer_failure("algo-2", "algo-2: the cause", 66, 3.0), 0, 5.2)


@pytest.mark.parametrize("roll, gate, now, expected", [
    (BOTH, GATE, 1.0, Passed(frozenset(HOSTS), {})),
    (Roll(), GATE, 1.0, Waiting(10.0)),
    (Roll(), GATE, 10.0, Failed(Outcome(EXIT_CLUSTER_ERROR, "algo-1: hosts not ready within 10 s "
                                                            "(never joined: algo-2, algo-3)"))),
    # joined but not ready; joined, lost, not back
    (Roll(frozenset({"algo-2"}), frozenset(HOSTS[1:])), GATE, 10.0,
     Failed(Outcome(EXIT_CLUSTER_ERROR, "algo-1: hosts not ready within 10 s (left the job and did not join again: "
                                        "algo-3; joined but never ready: algo-2)"))),
    # ready for another attempt does not count
    (replace(BOTH, ready={"algo-2": 0, "algo-3": 1}), GATE, 10.0,
     Failed(Outcome(EXIT_CLUSTER_ERROR, "algo-1: hosts not ready within 10 s (joined but never ready: algo-3)"))),
    # a failure heard: the window after the first one, then the earliest by when it happened (not by arrival)
    (replace(BOTH, heard=(LOSS, CAUSE)), GATE, 5.0 + FAILURE_WINDOW_S / 2, Waiting(5.0 + FAILURE_WINDOW_S)),
    (replace(BOTH, heard=(LOSS, CAUSE)), GATE, 5.0 + FAILURE_WINDOW_S, Failed(Outcome(66, "algo-2: the cause"))),
    # a failure ends the barrier even past its deadline, and before every host is ready
    (replace(BOTH, heard=(LOSS,)), GATE, 20.0, Failed(Outcome(EXIT_CLUSTER_ERROR, "algo-3: left the job (timed out)"))),
    # a failure of another attempt is not this barrier's
    (replace(BOTH, heard=(replace(CAUSE, attempt=1),)), GATE, 20.0, Passed(frozenset(HOSTS), {})),
    # alive only (spares, a minimum): a loss is no failure, and a host not linked is not waited for
    (replace(BOTH, linked=frozenset({"algo-2"}), heard=(LOSS,), lost_why={"algo-3": "timed out"}),
     replace(GATE, alive_only=True), 1.0, Passed(frozenset({"algo-1", "algo-2"}), {"algo-3": "timed out"})),
    # a host ready but lost since is not among those ready
    (replace(BOTH, linked=frozenset({"algo-2"})), replace(GATE, alive_only=True), 1.0,
     Passed(frozenset({"algo-1", "algo-2"}), {})),
    # a job of one host: nothing to wait for
    (Roll(), Barrier(0, (), 10.0, 10.0), 0.0, Passed(frozenset({"algo-1"}), {})),
])
def test_the_barrier_decided(roll, gate, now, expected):
    assert decide("algo-1", roll, gate, now) == expected


def test_the_message_lists_each_kind_of_missing_host_in_rank_order():
    roll = Roll(frozenset({"c"}), frozenset({"b", "c"}))
    assert not_ready(roll, ["a", "b", "c", "d"], 2.5) == ("hosts not ready within 2.5 s (never joined: a, d; left the "
                                                         "job and did not join again: b; joined but never ready: c)")


@pytest.mark.parametrize("event, channel_attempt, expected", [
    (PeerJoined("algo-2"), 0, Roll(frozenset({"algo-2"}), frozenset({"algo-2"}))),
    (PeerReady("algo-2", 1), 0, Roll(ready={"algo-2": 1})),  # a host that rejoined, ready for the next restart
    (PeerReady("algo-2", 0), 1, Roll()),  # stale: the channel is past it
    (PeerLost("algo-2", "timed out", 4.0), 1,
     Roll(lost_why={"algo-2": "timed out"}, heard=(Heard(failures.lost("algo-2", "timed out", 4.0), 1, 9.0, True),))),
    (PeerFailed("algo-2", "boom", 3, 4.0, attempt=1), 1,
     Roll(heard=(Heard(failures.peer_failure("algo-2", "boom", 3, 4.0), 1, 9.0),))),
    (PeerFailed("algo-2", "boom", 3, 4.0, attempt=0), 1, Roll()),  # of an attempt over
])
def test_what_the_roll_keeps_of_each_event(event, channel_attempt, expected):
    assert note(Roll(), event, 9.0, channel_attempt) == expected


def test_a_failure_reported_by_a_host_names_it_once():
    assert failures.peer_failure("algo-2", "boom", 1, None).outcome.reason == "algo-2: boom"
    assert failures.peer_failure("algo-2", "algo-2: boom", 1, None).outcome.reason == "algo-2: boom"
    assert failures.peer_failure("algo-2", "algo-2 rank 3: boom", 1, None).outcome.reason == "algo-2 rank 3: boom"


def test_one_root_cause_rule_for_the_barrier_and_the_running_job():
    assert barrier.root_cause is lead.root_cause is failures.root_cause
    later, earlier, unknown = (failures.Failure(Outcome(1, x), at) for x, at in (("a", 5.0), ("b", 4.0), ("c", None)))
    assert failures.root_cause((unknown, later, earlier)) is earlier
    same = failures.Failure(Outcome(2, "d"), 5.0)
    assert failures.root_cause((later, same)) is later  # ties by arrival


# Through the step: the first host's barrier as the loop runs it ---------------------------------------------------


def test_every_host_ready_releases_the_attempt():
    state, actions = run(master(), *((1.0, e) for e in joined_ready("algo-2")), (2.0, BarrierOpened(HOSTS[1:], 10.0)))
    assert actions == [] and next_deadline(state) == 12.0  # the barrier's deadline, from its opening
    state, actions = run(state, *((3.0, e) for e in joined_ready("algo-3")))
    assert actions == [Release(frozenset(HOSTS), {})]
    assert state.lead.barrier is None and state.deadline is None and state.phase == Phase.SETUP


def test_the_deadline_is_a_decision_on_a_tick_and_the_job_is_told():
    state, actions = run(master(), (1.0, PeerJoined("algo-2")), (1.0, BarrierOpened(HOSTS[1:], 5.0)))
    assert step(state, Tick(), 5.9) == (state, ())
    state, actions = run(state, (6.0, Tick()))
    outcome = Outcome(EXIT_CLUSTER_ERROR, "algo-1: hosts not ready within 5 s (never joined: algo-3; joined but never "
                                          "ready: algo-2)")
    assert actions == told(outcome) and state.phase == Phase.ENDED and state.outcome == outcome


def test_the_earliest_failure_at_a_barrier_is_the_cause_after_the_window():
    state, actions = run(master(), *((1.0, e) for e in joined_ready("algo-2", "algo-3")[:3]),
                         (1.0, BarrierOpened(HOSTS[1:], 60.0)),
                         (2.0, PeerFailed("algo-3", "algo-3: a consequence", 69, 100.0)),
                         (2.1, PeerFailed("algo-2", "algo-2: the cause", 66, 99.0)))
    assert actions == [] and next_deadline(state) == 2.0 + FAILURE_WINDOW_S
    state, actions = run(state, (2.0 + FAILURE_WINDOW_S, Tick()))
    assert actions == told(Outcome(66, "algo-2: the cause"))


def test_a_stopping_signal_during_the_barrier_is_an_event_that_interrupts_it():
    state, actions = run(master(), (1.0, BarrierOpened(HOSTS[1:], 60.0)), (2.0, GotSignal(TERM)))
    assert actions == [Interrupt(TERM)] and state.stop_signal == TERM


def test_a_restarts_barrier_counts_readies_and_losses_heard_while_the_attempt_stopped():
    """The channel is at the next attempt once the restart is called (STOPPING): what it hears then is for it."""
    stopping = master(phase=Phase.STOPPING, roll=Roll(frozenset(HOSTS[1:]), frozenset(HOSTS[1:])))
    state, _ = run(stopping, (1.0, PeerReady("algo-2", 1)), (1.1, PeerLost("algo-3", "closed", 50.0)),
                   (1.2, PeerReady("algo-3", 0)))  # a late ready of the attempt over
    state = replace(state, phase=Phase.BARRIER, attempt=1)
    state, actions = run(state, (2.0, BarrierOpened(HOSTS[1:], 60.0)), (2.0 + FAILURE_WINDOW_S, Tick()))
    assert actions == told(Outcome(EXIT_CLUSTER_ERROR, "algo-3: left the job (closed)"))
    state, actions = run(replace(stopping, attempt=0), (1.0, PeerReady("algo-2", 1)),
                         (1.1, PeerLost("algo-3", "closed", 50.0)))
    state = replace(state, phase=Phase.BARRIER, attempt=1)
    state, actions = run(state, (2.0, BarrierOpened(HOSTS[1:], 60.0, alive_only=True)))
    assert actions == [Release(frozenset({"algo-1", "algo-2"}), {"algo-3": "closed"})]


def test_a_loss_while_the_attempt_runs_is_that_attempts_failure_not_the_next_barriers():
    running = master(phase=Phase.RUNNING, primaries=frozenset({"script"}), roll=Roll(frozenset(HOSTS[1:]),
                                                                                     frozenset(HOSTS[1:])))
    state, _ = run(running, (1.0, PeerLost("algo-3", "closed", 50.0)))
    assert [f.outcome.reason for f in state.failures] == ["algo-3: left the job (closed)"]
    state = replace(state, phase=Phase.BARRIER, attempt=1, failures=())
    state, actions = run(state, (2.0, BarrierOpened(HOSTS[1:], 5.0)), *((2.1, e) for e in joined_ready(
        "algo-2", "algo-3", attempt=1)))
    assert actions == [Release(frozenset(HOSTS), {"algo-3": "closed"})]
