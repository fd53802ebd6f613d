"""Spares and a job that shrinks, in the agent's decisions (tables).  No processes, sockets or root.

The first host hears the attempt's active hosts with ``Started``; the other hosts are spares: no part,
so their loss is said, not a failure, and nothing waits for them (their success, their stop).
"""

from __future__ import annotations

import signal

import pytest

from training_toolkit.cluster.events import PeerDone, PeerFailed, PeerLost, Verdict
from training_toolkit.agent.decisions import (FAILURE_WINDOW_S, PEER_FINISH_TIMEOUT_S, RUNNING, Announce, Finish,
                                        GotSignal, LocalExit, PartStopped, Say, Started, Tick, active_workers,
                                        first_host, other_host, step, stop_wait)
from training_toolkit.errors import EXIT_CLUSTER_ERROR
from training_toolkit.process import ExitStatus
from training_toolkit.report import Outcome

OK = ExitStatus(0)
H = ("algo-1", "algo-2", "algo-3", "algo-4")


def run(state, *timed_events):
    actions = []
    for now, event in timed_events:
        state, new = step(state, event, now)
        actions += new
    return state, actions


def master(active=H[:3], wait_for_peers=True, **kw):
    """The first host of 4 hosts, the attempt running on ``active`` (None: every host)."""
    return step(first_host("algo-1", H[1:], wait_for_peers, **kw), Started(("rank 0",), active), 0.0)[0]


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
    state = step(other_host("algo-4"), Started((), H[:3]), 0.0)[0]
    assert state.phase == RUNNING and state.primaries == frozenset() and state.seated is None


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
])
def test_each_restart_records_whose_own_processes_caused_it(events, want):
    state = master(wait_for_peers=False, max_restarts=2)
    state, actions = run(state, *[(1.0 + i * 0.1, e) for i, e in enumerate(events)], (2.0, Tick()))
    assert state.cause_hosts == want and state.phase.name == "STOPPING"
