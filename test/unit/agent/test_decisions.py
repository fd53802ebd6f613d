"""The agent's decisions as exact tables: (state, event, now) -> (state, actions).  No processes, sockets or root."""

from __future__ import annotations

import signal
from helpers.steps import run
from training_toolkit.core.records import replace

import pytest

from training_toolkit.cluster.events import PeerDone, PeerFailed, PeerLost, Verdict
from training_toolkit.agent.decisions import (ENDED, FAILURE_WINDOW_S, PEER_FINISH_TIMEOUT_S, REPORT_WAIT_S, RUNNING,
                                        SETUP, Announce, EndLaunchers, Failure, Finish, Forward, GotSignal, Interrupt, LocalExit,
                                        PartStopped, Report, ReportDone, SetupFailed, Started, Tick, lead_state,
                                        follower_state, root_cause, step)
from training_toolkit.core.errors import EXIT_CLUSTER_ERROR
from training_toolkit.supervise.process import ExitStatus
from training_toolkit.job.report import Outcome

OK, FAILED = ExitStatus(0), ExitStatus(1)
TERM, USR1 = int(signal.SIGTERM), int(signal.SIGUSR1)
RANK3 = Outcome(1, "algo-2 rank 3: train.py exited with code 1: ValueError: boom")


def master(wait_for_peers=False, primaries=("script",)):
    state = lead_state("algo-1", ("algo-2", "algo-3"), wait_for_peers)
    return replace(state, phase=RUNNING, primaries=frozenset(primaries))


def worker(primaries=("script",)):
    return replace(follower_state("algo-2"), phase=RUNNING, primaries=frozenset(primaries))



def announced(outcome, host="algo-1", linger=True):
    return [Announce(Verdict(outcome.exit_code, outcome.reason, host), linger), Finish(outcome)]


# The root cause: the earliest failure, by when it happened -------------------------------------------


def test_a_worker_failing_then_the_first_hosts_own_earlier_failure_names_the_first_host():
    own = Outcome(1, "algo-1: train.py exited with code 1: RuntimeError: NCCL")
    state, actions = run(master(),
                         (10.0, PeerFailed("algo-2", RANK3.reason, 1, at=1000.30)),  # arrives first, happened later
                         (10.1, LocalExit("script", FAILED, at=1000.10, failure=own)))
    assert actions == [] and state.deadline == 10.0 + FAILURE_WINDOW_S  # the window opened with the first failure
    assert [f.at for f in state.failures] == [1000.30, 1000.10]
    state, actions = run(state, (10.0 + FAILURE_WINDOW_S, Tick()))
    assert actions == announced(own) and state.phase == ENDED and state.outcome == own


def test_the_first_report_wins_when_it_also_happened_first():
    own = Outcome(134, "algo-1: train.py terminated by SIGABRT")
    state, actions = run(master(),
                         (5.0, PeerFailed("algo-3", "algo-3: train.py exited with code 2", 2, at=700.0)),
                         (5.2, LocalExit("script", ExitStatus(-6), at=700.2, failure=own)),
                         (5.0 + FAILURE_WINDOW_S, Tick()))
    assert actions == announced(Outcome(2, "algo-3: train.py exited with code 2"))


def test_a_failure_after_the_window_closed_is_not_heard():
    state, actions = run(master(), (1.0, PeerFailed("algo-2", "late", 3, at=50.0)), (1.0 + FAILURE_WINDOW_S, Tick()),
                         (1.6, PeerFailed("algo-3", "earlier", 4, at=40.0)))
    assert actions == announced(Outcome(3, "algo-2: late"))


def test_a_tick_before_the_window_closes_decides_nothing():
    state, _ = run(master(), (1.0, PeerLost("algo-3", "timed out", at=99.0)))
    assert step(state, Tick(), 1.0 + FAILURE_WINDOW_S / 2) == (state, ())


@pytest.mark.parametrize("failures, expected", [
    ((Failure(Outcome(1, "a"), 5.0), Failure(Outcome(2, "b"), 4.0)), "b"),  # earliest
    ((Failure(Outcome(1, "a"), None), Failure(Outcome(2, "b"), 9.0)), "b"),  # an unknown time ranks last
    ((Failure(Outcome(1, "a"), 5.0), Failure(Outcome(2, "b"), 5.0)), "a"),  # a tie: the first to arrive
    ((Failure(Outcome(1, "a"), None), Failure(Outcome(2, "b"), None)), "a"),
])
def test_root_cause_ordering(failures, expected):
    assert root_cause(failures).outcome.reason == expected


# The first host's table ------------------------------------------------------------------------------


@pytest.mark.parametrize("event, outcome, host", [
    (PeerFailed("algo-2", "train.py exited with code 3", 3, at=1.0), Outcome(3, "algo-2: train.py exited with code 3"),
     "algo-2"),
    (PeerFailed("algo-2", "algo-2: already named", 3, at=1.0), Outcome(3, "algo-2: already named"), "algo-2"),
    (PeerDone("algo-3", 7, at=1.0), Outcome(7, "algo-3: exited with code 7"), "algo-3"),
    # a host's loss is no host's own processes failing (``Failure.host``, for retiring a host: roster.to_retire)
    (PeerLost("algo-3", "timed out", at=1.0), Outcome(EXIT_CLUSTER_ERROR, "algo-3: left the job (timed out)"), None),
    (LocalExit("script", FAILED, at=1.0, failure=Outcome(1, "algo-1: train.py exited with code 1")),
     Outcome(1, "algo-1: train.py exited with code 1"), "algo-1"),
    (LocalExit("script", FAILED, at=1.0), Outcome(1, "algo-1: script exited with code 1"), "algo-1"),  # undescribed
    (LocalExit("parameter server", OK, at=1.0),
     Outcome(EXIT_CLUSTER_ERROR, "algo-1: parameter server ended before the job did"), "algo-1"),  # not a primary
    (PartStopped(TERM, at=1.0), Outcome(128 + TERM, "algo-1: stopped by SIGTERM"), None),
])
def test_first_host_failures(event, outcome, host):
    state, actions = run(master(), (0.0, event))
    stopped = isinstance(event, PartStopped)  # a stop is never a cause to restart
    assert actions == [] and state.failures == (Failure(outcome, 1.0, stopped, host),)
    assert state.deadline == FAILURE_WINDOW_S
    assert run(state, (FAILURE_WINDOW_S, Tick()))[1] == announced(outcome)


def test_first_host_success_without_waiting_for_peers():
    state, actions = run(master(primaries=("rank 0", "rank 1")), (1.0, LocalExit("rank 0", OK, at=1.0)))
    assert actions == [] and state.finished == {"rank 0"}
    assert run(state, (2.0, LocalExit("rank 1", OK, at=2.0)))[1] == announced(Outcome(0))


def test_success_waits_for_every_peer():
    state, actions = run(master(wait_for_peers=True), (0.5, PeerDone("algo-2", 0)), (1.0, LocalExit("script", OK)))
    assert actions == [] and state.lead.succeeded and state.deadline == 1.0 + PEER_FINISH_TIMEOUT_S
    state, actions = run(state, (3.0, Tick()))
    assert actions == [] and state.phase == RUNNING
    assert run(state, (4.0, PeerDone("algo-3", 0)))[1] == announced(Outcome(0))


def test_peer_finish_timeout():
    state, _ = run(master(wait_for_peers=True), (0.5, PeerDone("algo-3", 0)), (1.0, LocalExit("script", OK)))
    assert run(state, (1.0 + PEER_FINISH_TIMEOUT_S - 0.1, Tick()))[1] == []
    reason = f"algo-1: the job succeeded here but algo-2 did not finish within {PEER_FINISH_TIMEOUT_S:g} s"
    assert run(state, (1.0 + PEER_FINISH_TIMEOUT_S, Tick()))[1] == announced(Outcome(EXIT_CLUSTER_ERROR, reason))


def test_a_failure_while_waiting_for_peers_fails_the_job():
    state, _ = run(master(wait_for_peers=True), (1.0, LocalExit("script", OK)))
    state, actions = run(state, (2.0, PeerFailed("algo-2", "boom", 1, at=9.0)))
    assert actions == [] and state.deadline == 2.0 + FAILURE_WINDOW_S  # the window, not the peers' timeout
    assert run(state, (2.0 + FAILURE_WINDOW_S, Tick()))[1] == announced(Outcome(1, "algo-2: boom"))


def test_a_peer_lost_after_it_was_done_is_no_failure():
    state, actions = run(master(wait_for_peers=True), (1.0, PeerDone("algo-2", 0)), (2.0, PeerLost("algo-2", "closed")))
    assert actions == [] and state.failures == ()
    state, actions = run(state, (3.0, LocalExit("script", OK)), (4.0, PeerDone("algo-3", 0)))
    assert actions == announced(Outcome(0))


def test_a_peer_lost_before_it_was_done_is_a_failure():
    state, _ = run(master(), (1.0, PeerDone("algo-2", 0)), (2.0, PeerLost("algo-3", "closed", at=2.0)))
    assert state.failures == (Failure(Outcome(EXIT_CLUSTER_ERROR, "algo-3: left the job (closed)"), 2.0),)


def test_a_local_success_after_a_failure_does_not_end_the_job_well():
    state, actions = run(master(), (1.0, PeerFailed("algo-3", "x", 5, at=1.0)), (1.1, LocalExit("script", OK, at=1.1)))
    assert actions == [] and state.phase == RUNNING
    assert run(state, (1.0 + FAILURE_WINDOW_S, Tick()))[1] == announced(Outcome(5, "algo-3: x"))


def test_a_stopped_first_host_reports_the_stop_however_its_processes_ended():
    state, actions = run(master(), (1.0, GotSignal(TERM)))
    assert actions == [Forward(TERM)] and state.stop_signal == TERM
    state, actions = run(state, (2.0, LocalExit("script", OK, at=2.0)))  # a script that saved and exited 0
    assert state.failures == (Failure(Outcome(128 + TERM, "algo-1: stopped by SIGTERM"), 2.0, stopped=True),)
    assert run(state, (2.0 + FAILURE_WINDOW_S, Tick()))[1] == [EndLaunchers(), *announced(Outcome(128 + TERM, "algo-1: stopped by SIGTERM"), linger=False)]


def test_non_stopping_signals_are_forwarded_and_change_nothing():
    state, actions = run(master(), (1.0, GotSignal(USR1)))
    assert actions == [Forward(USR1)] and state == master()


# Setup: signals before the job starts, failures while setting up --------------------------------------


def test_a_stopping_signal_during_setup_interrupts_it():
    state, actions = step(lead_state("algo-1", ("algo-2",)), GotSignal(TERM), 0.0)
    assert actions == (Interrupt(TERM),) and state.phase == SETUP and state.stop_signal == TERM


def test_other_signals_during_setup_wait_for_the_start():
    state, actions = run(follower_state("algo-2"), (0.0, GotSignal(USR1)), (0.1, GotSignal(int(signal.SIGUSR2))))
    assert actions == [] and state.pending_signals == (USR1, int(signal.SIGUSR2))
    state, actions = step(state, Started(("script",)), 1.0)
    assert actions == (Forward(USR1), Forward(int(signal.SIGUSR2)))
    assert state.phase == RUNNING and state.primaries == {"script"} and state.pending_signals == ()


def test_setup_failure_on_the_first_host_is_announced():
    failed = Outcome(69, "algo-1: port 8950 in use")
    state, actions = step(lead_state("algo-1", ("algo-2",)), SetupFailed(failed, at=3.0), 0.0)
    assert actions == (Announce(Verdict(69, "algo-1: port 8950 in use", "algo-1")), Finish(failed))
    assert state.phase == ENDED


def test_setup_failure_elsewhere_is_reported_with_its_time():
    failed = Outcome(66, "algo-2: cannot start x")
    state, actions = step(follower_state("algo-2"), SetupFailed(failed, at=3.0), 0.0)
    assert actions == (Report("algo-2: cannot start x", 66, 3.0), Finish(failed)) and state.phase == ENDED


def test_nothing_after_the_end():
    state, _ = run(master(), (1.0, LocalExit("script", OK)))
    assert state.phase == ENDED
    assert step(state, PeerFailed("algo-2", "x", 1), 2.0) == (state, ())


# The other hosts' table -------------------------------------------------------------------------------


def test_worker_success_is_reported_then_the_verdict_ends_it():
    state, actions = run(worker(), (1.0, LocalExit("script", OK, at=1.0)))
    assert actions == [ReportDone(0)] and state.phase == RUNNING
    state, actions = run(state, (2.0, Verdict(0, None, "algo-1")))
    assert actions == [Finish(Outcome(0))] and state.phase == ENDED


def test_worker_reports_its_failure_with_when_it_happened_and_takes_the_verdict():
    state, actions = run(worker(), (1.0, LocalExit("script", FAILED, at=500.0, failure=RANK3)))
    assert actions == [Report(RANK3.reason, 1, 500.0)] and state.deadline == 1.0 + REPORT_WAIT_S
    verdict = Verdict(1, "algo-3: train.py exited with code 1", "algo-1")  # an earlier failure elsewhere
    assert run(state, (1.5, verdict))[1] == [Finish(Outcome(1, "algo-3: train.py exited with code 1"))]


def test_worker_reports_one_failure_only():
    state, actions = run(worker(primaries=("rank 2", "rank 3")),
                         (1.0, LocalExit("rank 3", FAILED, at=1.0, failure=RANK3)),
                         (1.1, LocalExit("rank 2", FAILED, at=1.1, failure=Outcome(1, "algo-2 rank 2: later"))))
    assert actions == [Report(RANK3.reason, 1, 1.0)]


def test_worker_ends_with_its_own_failure_when_the_first_host_never_answers():
    state, _ = run(worker(), (1.0, LocalExit("script", FAILED, at=1.0, failure=RANK3)))
    assert run(state, (1.0 + REPORT_WAIT_S - 0.1, Tick()))[1] == []
    assert run(state, (1.0 + REPORT_WAIT_S, Tick()))[1] == [Finish(RANK3)]


@pytest.mark.parametrize("own, outcome", [
    (None, Outcome(EXIT_CLUSTER_ERROR, "algo-2: lost the lead algo-1 (timed out)")),
    (RANK3, RANK3),
])
def test_worker_losing_the_first_host(own, outcome):
    state = worker()
    if own:
        state, _ = step(state, LocalExit("script", FAILED, at=1.0, failure=own), 1.0)
    assert run(state, (2.0, PeerLost("algo-1", "lost the lead algo-1 (timed out)")))[1] == [Finish(outcome)]


def test_worker_stopped_by_a_signal():
    state, actions = run(worker(), (1.0, GotSignal(TERM)), (2.0, LocalExit("script", OK, at=2.0)))
    assert actions == [Forward(TERM), Report("algo-2: stopped by SIGTERM", 128 + TERM, 2.0, stopped=True)]


def test_worker_part_stopped_by_its_runner():
    state, actions = run(replace(worker(), primaries=frozenset()), (1.0, GotSignal(TERM)),
                         (3.0, PartStopped(TERM, at=3.0)))
    assert actions == [Forward(TERM), Report("algo-2: stopped by SIGTERM", 128 + TERM, 3.0, stopped=True)]


def test_worker_helper_ending_on_its_own_is_a_failure():
    state, actions = run(worker(), (1.0, LocalExit("parameter server", OK, at=1.0)))
    assert actions == [Report("algo-2: parameter server ended before the job did", EXIT_CLUSTER_ERROR, 1.0)]
