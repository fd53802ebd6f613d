"""Spares and a job that shrinks, in the agent's decisions (tables).  No processes, sockets or root.

The first host hears the attempt's active hosts with ``Started``; the other hosts are spares: no part,
so their loss is said, not a failure, and nothing waits for them (their success, their stop).
"""

from __future__ import annotations

import signal

import pytest

from helpers.steps import run
from training_toolkit.cluster.events import PeerDone, PeerFailed, PeerLost, Verdict
from training_toolkit.agent.decisions import (FAILURE_WINDOW_S, PEER_FINISH_TIMEOUT_S, RUNNING, Announce, Finish,
                                        GotSignal, LocalExit, PartStopped, Say, Started, Tick, active_workers,
                                        lead_state, follower_state, step, stop_wait)
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR
from training_toolkit.supervise.process import ExitStatus
from training_toolkit.job.report import Outcome

OK = ExitStatus(0)
FAILED = ExitStatus(1)
H = ("algo-1", "algo-2", "algo-3", "algo-4")



def master(active=H[:3], wait_for_peers=True, **kw):
    """The first host of 4 hosts, the attempt running on ``active`` (None: every host)."""
    return step(lead_state("algo-1", H[1:], wait_for_peers, **kw), Started(("rank 0",), active), 0.0)[0]


def announced(outcome):
    return [Announce(Verdict(outcome.exit_code, outcome.reason, "algo-1")), Finish(outcome)]


@pytest.mark.parametrize("active, want", [
    (None, frozenset(H[1:])),  # no roster given: every host is active, as before spares
    (H, frozenset(H[1:])),
    (H[:3], frozenset(H[1:3])),
    (("algo-1", "algo-4", "algo-3"), frozenset({"algo-4", "algo-3"})),  # a spare seated in algo-2's place
    (("algo-1", "algo-3"), frozenset({"algo-3"})),  # shrunk
])
def test_the_first_host_takes_the_attempts_active_hosts_from_started(active, want):
    assert active_workers(master(active)) == want


def test_an_other_hosts_started_names_no_workers():
    state = step(follower_state("algo-4"), Started((), H[:3]), 0.0)[0]
    assert state.phase == RUNNING and state.primaries == frozenset() and state.lead is None  # a follower keeps no seats


@pytest.mark.parametrize("active, lost, want", [
    # a spare's loss: said, never a failure
    (H[:3], "algo-4", [Say("algo-1: algo-4, with no part in this attempt, was lost (connection closed); not a failure")]),
    # an active host's loss is a failure as always (the window opens)
    (H[:3], "algo-2", []),
    # every host active (no spares): a loss is a failure, as before
    (None, "algo-4", []),
])
def test_a_lost_host_is_a_failure_only_if_it_is_active(active, lost, want):
    state, actions = run(master(active), (1.0, PeerLost(lost, "connection closed", 100.0)))
    assert actions == want
    assert bool(state.failures) == (want == [])
    if want == []:
        assert state.deadline == 1.0 + FAILURE_WINDOW_S
        assert state.failures[0].outcome == Outcome(EXIT_CLUSTER_ERROR, f"{lost}: left the job (connection closed)")


def test_success_waits_only_for_the_active_hosts():
    state, actions = run(master(("algo-1", "algo-4", "algo-3")), (1.0, PeerDone("algo-4", 0)),
                         (1.5, LocalExit("rank 0", OK)))
    assert actions == [] and state.deadline == 1.5 + PEER_FINISH_TIMEOUT_S  # algo-3 still runs
    state, actions = run(state, (2.0, PeerDone("algo-3", 0)))
    assert actions == announced(Outcome(0))  # algo-2 (lost earlier, not seated) is not waited for


def test_the_peer_timeout_names_only_the_active_hosts_missing():
    state, _ = run(master(), (1.0, PeerDone("algo-3", 0)), (1.5, LocalExit("rank 0", OK)))
    state, actions = run(state, (1.5 + PEER_FINISH_TIMEOUT_S, Tick()))
    reason = f"algo-1: the job succeeded here but algo-2 did not finish within {PEER_FINISH_TIMEOUT_S:g} s"
    assert actions == announced(Outcome(EXIT_CLUSTER_ERROR, reason))


def test_a_stop_waits_only_for_the_active_hosts_parts():
    term = int(signal.SIGTERM)
    state = master(H[:3], wait_for_peers=False, stop_wait_s=stop_wait(20.0))
    state, actions = run(state, (1.0, GotSignal(term)), (2.0, PartStopped(term, 101.0)))
    assert state.failures and not any(isinstance(a, Finish) for a in actions)
    state, actions = run(state, (3.0, PeerFailed("algo-2", "algo-2: stopped by SIGTERM", 143, 102.0, stopped=True)))
    assert actions == []  # algo-3 has not stopped yet
    state, actions = run(state, (4.0, PeerFailed("algo-3", "algo-3: stopped by SIGTERM", 143, 103.0, stopped=True)))
    assert isinstance(actions[-1], Finish) and actions[-1].outcome.exit_code == 143  # the spare algo-4 not awaited


def test_a_failure_reported_by_a_host_with_no_part_is_said_not_the_jobs():
    """A spare has no ranks: what it reports (a host that came back and gave up waiting) fails no attempt."""
    state, actions = run(master(), (1.0, PeerFailed("algo-4", "algo-4: hosts not ready within 60 s", 69, 100.0)))
    assert actions == [Say("algo-1: algo-4, with no part in this attempt, failed (algo-4: hosts not ready within "
                           "60 s); not a failure")]
    assert not state.failures and state.deadline is None
    state, actions = run(master(), (1.0, PeerFailed("algo-3", "algo-3: boom", 1, 100.0)))
    assert actions == [] and state.failures  # an active host's failure is one, as always


@pytest.mark.parametrize("events, want", [
    # a worker's own rank: its host is the cause (two in a row retire it for a waiting spare: roster.to_retire)
    ([PeerFailed("algo-2", "algo-2 rank 1: train.py exited with code 1", 1, 100.0)], ("algo-2",)),
    # the earliest failure names the host, not the first report
    ([PeerFailed("algo-3", "algo-3 rank 2: gloo: connection closed", 1, 100.2),
      PeerFailed("algo-2", "algo-2 rank 1: train.py exited with code 1", 1, 100.0)], ("algo-2",)),
    # a host's loss is no host's own failure
    ([PeerLost("algo-2", "connection closed", 100.0)], (None,)),
    # this host's own process, the runner naming no other host: this host
    ([LocalExit("rank 0", FAILED, at=100.0, failure=Outcome(1, "algo-1 rank 0: train.py exited with code 1"))],
     ("algo-1",)),
    # mpirun's end on the first host, blamed by the runner on the failing rank's host (runners/mpi_failure.py)
    ([LocalExit("rank 0", FAILED, at=100.0, failure=Outcome(1, "rank 3 on algo-2 called MPI_Abort"), host="algo-2")],
     ("algo-2",)),
])
def test_each_restart_records_whose_own_processes_caused_it(events, want):
    state = master(wait_for_peers=False, max_restarts=2)
    state, actions = run(state, *[(1.0 + i * 0.1, e) for i, e in enumerate(events)], (2.0, Tick()))
    assert state.cause_hosts == want and state.phase.name == "STOPPING"


def test_mpiruns_failures_blamed_on_a_workers_ranks_twice_in_a_row_retire_it_for_the_waiting_spare():
    """The whole chain on the first host: two attempts' mpirun failures blamed on algo-2, then the roster."""
    from training_toolkit.agent import roster
    from training_toolkit.agent.decisions import PartEnded

    said = Outcome(1, "rank 3 on algo-2 called MPI_Abort")
    state = step(lead_state("algo-1", H[1:3], max_restarts=3), Started(("mpirun",), H[:2]), 0.0)[0]
    for attempt in (0, 1):
        state, _ = run(state, (1.0, LocalExit("mpirun", FAILED, 100.0, said, attempt, host="algo-2")), (2.0, Tick()))
        assert state.phase.name == "STOPPING"
        state, _ = run(state, (3.0, PartEnded(attempt)), (4.0, Started(("mpirun",), H[:2])))
    assert state.cause_hosts == ("algo-2", "algo-2")
    retire = roster.to_retire(state.cause_hosts)
    assert retire == frozenset({"algo-2"})
    turn = roster.next_roster(roster.Roster(H[:2], ("algo-3",)), frozenset(H[:3]), retire=retire)
    assert turn == roster.Turn(roster.Roster(("algo-1", "algo-3"), (), ("algo-2",)),
                               ("algo-2 retired after 2 failures; algo-3 takes its place",))


def stopping(active=H[:3]):
    """The first host of 4, its attempt 0 on ``active`` failed (algo-2's rank) and the restart called: STOPPING."""
    from training_toolkit.agent.decisions import PeerJoined

    state = master(active, wait_for_peers=False, max_restarts=2)
    state, _ = run(state, *[(0.5, PeerJoined(h)) for h in H[1:]],  # every host linked (the roll)
                   (1.0, PeerFailed("algo-2", "algo-2 rank 1: boom", 1, 100.0)), (2.0, Tick()))
    assert state.phase.name == "STOPPING"
    return state


def at_restart_barrier(active=H[:3], alive_only=True):
    """``stopping``'s first host at attempt 1's barrier (``alive_only``: the job has spares or a minimum)."""
    from training_toolkit.agent.decisions import BarrierOpened, PartEnded

    state, _ = run(stopping(active), (3.0, PartEnded(0)), (4.0, BarrierOpened(H[1:], 60.0, alive_only)))
    assert state.lead.barrier is not None and state.attempt == 1
    return state


SPARE_LOST = Say("algo-1: algo-4, with no part in this attempt, was lost (connection closed); not a failure")


@pytest.mark.parametrize("state, lost, want", [
    # a spare lost at a restart's barrier that waits for the hosts alive only: said, as while the job runs
    (lambda: at_restart_barrier(), "algo-4", [SPARE_LOST]),
    # ... or while the attempt stops for that restart (the loss counts at that barrier: no failure there either)
    (lambda: stopping(), "algo-4", [SPARE_LOST]),
    # an active host lost there: no line here; the next attempt's line names it ("algo-2 lost: ...")
    (lambda: at_restart_barrier(), "algo-2", []),
    (lambda: stopping(), "algo-3", []),
    # every host active (no spare): nothing to say
    (lambda: at_restart_barrier(None), "algo-4", []),
])
def test_a_spare_lost_between_attempts_is_said(state, lost, want):
    state, actions = run(state(), (5.0, PeerLost(lost, "connection closed", 100.0)))
    assert [a for a in actions if isinstance(a, Say)] == want
    assert state.phase.name != "ENDED"


def test_a_spare_lost_at_a_restarts_barrier_is_said_and_the_barrier_passes_without_it():
    from training_toolkit.agent.decisions import PeerReady, Release

    state, actions = run(at_restart_barrier(), (5.0, PeerReady("algo-2", 1)), (5.1, PeerReady("algo-3", 1)),
                         (5.2, PeerLost("algo-4", "connection closed", 100.0)))
    assert actions == [SPARE_LOST, Release(frozenset(H[:3]), {"algo-4": "connection closed"})]


def test_a_loss_at_barrier_0_is_not_said_as_a_spares():
    """At the first barrier every host is expected: a loss there is the setup's failure, not a line."""
    from training_toolkit.agent.decisions import BarrierOpened

    state, _ = run(lead_state("algo-1", H[1:]), (0.0, BarrierOpened(H[1:], 60.0)))
    state, actions = run(state, (1.0, PeerLost("algo-4", "connection closed", 100.0)))
    assert not [a for a in actions if isinstance(a, Say)]
    state, actions = run(state, (1.0 + FAILURE_WINDOW_S, Tick()))
    assert state.phase.name == "ENDED" and "algo-4: left the job (connection closed)" in actions[-1].outcome.reason
