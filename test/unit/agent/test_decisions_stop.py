"""A stop's verdict waits for every host's part (decisions, as tables).  No processes, sockets or root.

Each host reports its stop once its whole part has stopped (``PartStopped``), not when its first
process ends; the first host announces the verdict once every host's part has stopped, or at the
stop's deadline (the grace period and a margin), never when the first report comes.
"""

from __future__ import annotations

import signal

from helpers.steps import run
from training_toolkit.cluster.events import PeerFailed, PeerLost, Verdict
import pytest

from training_toolkit.agent.decisions import (FAILURE_WINDOW_S, REPORT_WAIT_S, STOP_HEARD_S, STOP_MARGIN_S, Announce, EndLaunchers,
                                              Finish, Forward,
                                              GotSignal, LocalExit, PartStopped, Report, Started, Tick, lead_state,
                                              next_deadline, follower_state, step, stop_wait)
from training_toolkit.supervise.process import ExitStatus
from training_toolkit.job.report import Outcome

TERM = int(signal.SIGTERM)
GRACE = 20.0
WAIT = stop_wait(GRACE)
STOPPED = ExitStatus(143)



def master(workers=("algo-2", "algo-3"), **kw):
    return step(lead_state("algo-1", workers, stop_wait_s=WAIT, **kw), Started(("rank-0", "rank-1")), 0.0)[0]


def worker():
    return step(follower_state("algo-2", stop_wait_s=WAIT), Started(("rank-2", "rank-3")), 0.0)[0]


def stopped_report(host):
    return PeerFailed(host, f"{host}: stopped by SIGTERM", 143, 1.0, 0, True)


def test_the_wait_is_the_grace_and_a_margin():
    assert WAIT == GRACE + STOP_MARGIN_S


def test_the_first_host_waits_for_every_hosts_part_then_announces_its_stop():
    state, actions = run(master(), (1.0, GotSignal(TERM)))
    assert actions == [Forward(TERM)]
    assert next_deadline(state) == 1.0 + WAIT
    # its own processes end one by one, a worker's part stops: nothing yet (the first report is not all)
    state, actions = run(state, (1.1, LocalExit("rank-1", STOPPED)), (1.2, stopped_report("algo-2")),
                         (1.2 + FAILURE_WINDOW_S + 1, Tick()), (2.0, LocalExit("rank-0", STOPPED)),
                         (2.0, PartStopped(TERM, 2.0)), (3.0, Tick()))
    assert actions == []
    # the last host's part stops after its slow handler: the verdict, the stop
    state, actions = run(state, (6.0, stopped_report("algo-3")))
    assert [type(a) for a in actions] == [EndLaunchers, Announce, Finish]
    assert actions[-1].outcome.exit_code == 143 and "stopped by SIGTERM" in actions[-1].outcome.reason


def test_a_host_that_never_reports_is_waited_for_until_the_deadline():
    state, _ = run(master(), (1.0, GotSignal(TERM)), (1.5, PartStopped(TERM, 1.5)), (1.6, stopped_report("algo-2")))
    state, actions = run(state, (1.0 + WAIT - 0.1, Tick()))
    assert actions == []
    state, actions = run(state, (1.0 + WAIT, Tick()))
    assert [type(a) for a in actions] == [EndLaunchers, Announce, Finish] and actions[-1].outcome.exit_code == 143


def test_a_lost_host_counts_as_stopped():
    state, _ = run(master(), (1.0, GotSignal(TERM)), (1.5, PartStopped(TERM, 1.5)), (1.6, stopped_report("algo-2")))
    state, actions = run(state, (2.0, PeerLost("algo-3", "connection closed")))
    assert [type(a) for a in actions] == [EndLaunchers, Announce, Finish]


def test_the_deadline_holds_even_if_nothing_reports():
    state, _ = run(master(), (1.0, GotSignal(TERM)))
    state, actions = run(state, (1.0 + WAIT, Tick()))
    assert [type(a) for a in actions] == [EndLaunchers, Announce, Finish]
    assert actions[-1].outcome.exit_code == 143 and actions[-1].outcome.reason.endswith(": stopped by SIGTERM")


def test_an_other_host_reports_once_its_whole_part_stopped_and_waits_for_the_verdict():
    state, actions = run(worker(), (1.0, GotSignal(TERM)), (1.1, LocalExit("rank-2", STOPPED)))
    assert actions == [Forward(TERM)]  # one process ended: not yet the part
    state, actions = run(state, (4.0, PartStopped(TERM, 4.0)))
    assert [type(a) for a in actions] == [Report] and actions[0].stopped
    assert next_deadline(state) == 4.0 + max(REPORT_WAIT_S, WAIT)  # the first host may wait for others this long
    state, actions = run(state, (5.0, Verdict(143, "algo-1: stopped by SIGTERM", "algo-1")))
    assert [type(a) for a in actions] == [Finish]


def test_without_a_signal_of_its_own_the_first_host_keeps_its_window():
    """A stopped report from a host when the first host was not stopped: a failure like others (0.5 s window)."""
    state, actions = run(master(), (1.0, stopped_report("algo-2")))
    assert actions == [] and next_deadline(state) == 1.0 + FAILURE_WINDOW_S
    state, actions = run(state, (1.0 + FAILURE_WINDOW_S, Tick()))
    assert [type(a) for a in actions] == [Announce, Finish]


def test_a_real_failure_is_still_concluded_after_the_window():
    state, actions = run(master(), (1.0, LocalExit("rank-1", ExitStatus(1))))
    assert next_deadline(state) == 1.0 + FAILURE_WINDOW_S
    state, actions = run(state, (1.0 + FAILURE_WINDOW_S, Tick()))
    assert [type(a) for a in actions] == [Announce, Finish] and actions[-1].outcome.exit_code == 1


def test_a_job_of_one_seat_keeps_its_scripts_own_end():
    state = step(lead_state("algo-1", (), own_end_on_stop=True, stop_wait_s=WAIT), Started(("script",)), 0.0)[0]
    state, actions = run(state, (1.0, GotSignal(TERM)), (1.5, PartStopped(TERM, 1.5)))
    assert actions == [Forward(TERM)]  # its part's stop says nothing: the script's exit is the verdict
    state, actions = run(state, (2.0, LocalExit("script", ExitStatus(0))))
    assert [type(a) for a in actions] == [Announce, Finish] and actions[-1].outcome.exit_code == 0


# A process that ends by the stop before its host hears the stop (Slurm signals every process at once) ---------


@pytest.mark.parametrize("status, held", [
    (ExitStatus(143), True),  # its handler exited 128 + SIGTERM
    (ExitStatus(-15), True),  # no handler: SIGTERM's default
    (ExitStatus(130), True), (ExitStatus(-2), True), (ExitStatus(129), True),  # SIGINT, SIGHUP
    (ExitStatus(1), False), (ExitStatus(137), False), (ExitStatus(-9), False), (ExitStatus(0), False),
    (ExitStatus(-15, killed_by_us=True), False),  # the toolkit's own stop of it
])
def test_which_ends_wait_for_the_hosts_own_signal(status, held):
    state, actions = run(worker(), (1.0, LocalExit("rank-2", status)))
    assert (state.held != ()) == held and (next_deadline(state) == 1.0 + STOP_HEARD_S) == held
    if held:
        assert actions == []


def test_a_first_hosts_rank_that_ended_by_the_stop_first_is_part_of_the_stop():
    state, actions = run(master(), (1.0, LocalExit("rank-1", STOPPED)), (1.3, GotSignal(TERM)))
    assert actions == [Forward(TERM)] and state.failures == () and state.held == ()
    assert next_deadline(state) == 1.3 + WAIT  # the stop's wait: every host's part, each rank its grace
    state, actions = run(state, (4.0, LocalExit("rank-0", STOPPED)), (4.0, PartStopped(TERM, 4.0)),
                         (4.1, stopped_report("algo-2")), (9.0, stopped_report("algo-3")))
    assert [type(a) for a in actions] == [EndLaunchers, Announce, Finish]
    assert actions[-1].outcome.exit_code == 143 and actions[-1].outcome.reason.endswith(": stopped by SIGTERM")


def test_an_other_hosts_rank_that_ended_by_the_stop_first_is_not_reported_as_a_failure():
    state, actions = run(worker(), (1.0, LocalExit("rank-2", STOPPED)), (1.0 + STOP_HEARD_S - 0.1, Tick()))
    assert actions == []  # not yet: the host's own signal may still come
    state, actions = run(state, (2.5, GotSignal(TERM)))
    assert actions == [Forward(TERM)] and state.failures == ()
    state, actions = run(state, (12.0, PartStopped(TERM, 12.0)))  # its slow rank saved for 10 s: its part, stopped
    assert [type(a) for a in actions] == [Report] and actions[0].stopped and "stopped by SIGTERM" in actions[0].reason


def test_an_end_by_sigterm_with_no_stop_of_the_host_is_a_failure_once_the_wait_is_over():
    failed = Outcome(143, "algo-2 rank 2: train.py exited with code 143")
    state, actions = run(worker(), (1.0, LocalExit("rank-2", STOPPED, at=100.0, failure=failed)),
                         (1.0 + STOP_HEARD_S, Tick()))
    assert actions == [Report(failed.reason, 143, 100.0, 0, False)] and state.held == ()
    state, actions = run(master(), (1.0, LocalExit("rank-1", STOPPED, at=100.0, failure=failed)),
                         (1.0 + STOP_HEARD_S, Tick()))
    assert actions == [] and [f.outcome for f in state.failures] == [failed]  # the window for earlier reports
    state, actions = run(state, (1.0 + STOP_HEARD_S + FAILURE_WINDOW_S, Tick()))
    assert actions[-1] == Finish(failed)
