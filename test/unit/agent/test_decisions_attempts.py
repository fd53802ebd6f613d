"""The agent's decisions for stalls and restarts, as exact tables.  No processes, sockets or root."""

from __future__ import annotations

import signal
from helpers.steps import run
from training_toolkit.core.records import replace

from training_toolkit.cluster.events import PeerFailed, PeerLost, Verdict
from training_toolkit.cluster.events import PeerProgress, RestartCalled, StacksWanted
from training_toolkit.agent.decisions import (FAILURE_WINDOW_S, REPORT_WAIT_S, STACKS_WAIT_S, Announce, AnnounceRestart, EndLaunchers,
                                        Finish, Forward, GatherStacks, GotSignal, Interrupt, LocalExit, PartEnded,
                                        Phase, Progress, Rejoin, Report, SendStacks, SetupFailed, ShareProgress,
                                        StacksGathered, Started, StopPart, Tick, Watch, lead_state, next_deadline,
                                        follower_state, step)
from training_toolkit.core.errors import EXIT_STALLED
from training_toolkit.supervise.process import ExitStatus
from training_toolkit.job.report import Outcome
from training_toolkit.stalls.stackreport import Frame, RankStack

TERM = int(signal.SIGTERM)
KILLED = ExitStatus(-9)
RANK3 = Outcome(137, "algo-2 rank 3: train.py killed by SIGKILL")
WATCH = Watch(stall_s=10.0, startup_s=60.0)



def master(max_restarts=0, watch=None):
    return step(lead_state("algo-1", ("algo-2",), max_restarts=max_restarts, watch=watch), Started(("script",)), 0.0)[0]


def worker(max_restarts=0):
    return step(follower_state("algo-2", max_restarts), Started(("script",)), 0.0)[0]


# Stalls ------------------------------------------------------------------------------------------------


def test_the_startup_allowance_then_the_stall_timeout_from_the_last_progress():
    state = master(watch=WATCH)
    assert state.lead.stall_deadline == 60.0 and next_deadline(state) == 60.0  # no progress yet: the longer allowance
    state, actions = run(state, (59.9, Tick()))
    assert actions == [] and state.phase == Phase.RUNNING
    state, _ = run(state, (5.0, Progress()), (12.0, PeerProgress("algo-2")))
    assert state.lead.stall_deadline == 22.0
    state, actions = run(state, (21.9, Tick()))
    assert actions == []
    state, actions = run(state, (22.0, Tick()))
    assert actions == [GatherStacks()] and state.phase == Phase.GATHERING and state.deadline == 22.0 + STACKS_WAIT_S


def test_once_a_heartbeat_came_only_heartbeats_are_progress():
    state, _ = run(master(watch=WATCH), (1.0, Progress(heartbeat=True)))
    assert state.lead.heartbeats and state.lead.stall_deadline == 11.0
    state, _ = run(state, (5.0, Progress()), (6.0, PeerProgress("algo-2")))  # output: no longer progress
    assert state.lead.stall_deadline == 11.0
    state, _ = run(state, (7.0, PeerProgress("algo-2", heartbeat=True)))
    assert state.lead.stall_deadline == 17.0


def test_no_watch_no_stall():
    state = master()
    assert state.lead.stall_deadline is None and next_deadline(state) is None
    assert run(state, (1e9, Tick()))[1] == []


ALLREDUCE = (Frame("<module>", "/c/train.py", 8, "comm.allreduce(x)"),)
STACKS = (RankStack("algo-2", 3, "rank 3", (Frame("hang", "/c/train.py", 6, "time.sleep(60)"),), "faulthandler"),
          RankStack("algo-1", 0, "rank 0", ALLREDUCE, "py-spy"), RankStack("algo-1", 1, "rank 1", ALLREDUCE, "py-spy"))
STALL_REASON = ("algo-1: the job stalled: no output line or heartbeat from any rank for 10 s; stacks: "
                "rank 3 on algo-2: time.sleep(60) at train.py:6; ranks 0-1 on algo-1: comm.allreduce(x) at train.py:8")


def test_a_stall_names_every_ranks_stack_then_ends_the_job():
    state, _ = run(master(watch=WATCH), (60.0, Tick()))
    state, actions = run(state, (61.0, LocalExit("script", KILLED, 61.0, RANK3)),  # meanwhile: does not change it
                         (61.5, StacksGathered(STACKS)))
    outcome = actions[-1].outcome
    assert actions == [Announce(Verdict(EXIT_STALLED, STALL_REASON, "algo-1")), Finish(outcome)]
    assert outcome.reason == STALL_REASON and outcome.details[0].startswith("stacks (main thread")
    assert "rank 3 on algo-2 (faulthandler):" in outcome.details and state.phase == Phase.ENDED


def test_stacks_that_never_come_still_end_the_stall():
    state, _ = run(master(watch=WATCH), (60.0, Tick()))
    state, actions = run(state, (60.0 + STACKS_WAIT_S, Tick()))
    assert actions[0].verdict.exit_code == EXIT_STALLED and "no stacks" in actions[0].verdict.reason


def test_a_stall_with_a_restart_left_restarts():
    state, _ = run(master(max_restarts=1, watch=WATCH), (60.0, Tick()))
    state, actions = run(state, (61.0, StacksGathered(STACKS, ("algo-3",))))
    reason = STALL_REASON + "; no stacks from algo-3"
    assert actions == [AnnounceRestart(1, reason), StopPart(0)] and state.phase == Phase.STOPPING


def test_other_hosts_share_progress_and_send_stacks():
    state = worker()
    assert run(state, (1.0, Progress(heartbeat=True)))[1] == [ShareProgress(True)]
    assert run(state, (1.0, Progress(True, 0, checkpoint=True)))[1] == [ShareProgress(True, checkpoint=True)]
    assert run(state, (1.0, StacksWanted()))[1] == [SendStacks()]


def test_the_lead_tells_every_host_each_checkpoint_marked_in_any_phase_a_follower_only_records_them():
    from training_toolkit.agent.decisions import MarkShared, ShareMark

    lead = replace(master(watch=WATCH), attempt=2)  # each mark with its attempt
    assert run(lead, (1.0, Progress(True, 2, checkpoint=True)))[1] == [ShareMark("algo-1", 2)]  # its own ranks'
    assert run(lead, (1.0, PeerProgress("algo-2", True, checkpoint=True)))[1] == [ShareMark("algo-2", 2)]
    assert run(lead, (1.0, PeerProgress("algo-2", True)))[1] == []  # progress alone is no mark
    stopping = replace(lead, phase=Phase.STOPPING)  # a save in a stop's grace is a mark too
    assert run(stopping, (1.0, PeerProgress("algo-2", True, checkpoint=True)))[1] == [ShareMark("algo-2", 2)]
    assert run(worker(), (1.0, MarkShared("algo-3")))[1] == []  # the record's (recording.observed), no decision
    assert run(worker(), (1.0, Progress(True, 0, checkpoint=True)))[1] == [ShareProgress(True, checkpoint=True)]


# Restarts ----------------------------------------------------------------------------------------------


def test_a_failure_with_restarts_left_stops_every_host_then_meets_at_the_next_barrier():
    state, actions = run(master(max_restarts=2), (1.0, PeerFailed("algo-2", RANK3.reason, 137, at=100.0)),
                         (1.0 + FAILURE_WINDOW_S, Tick()))
    assert actions == [AnnounceRestart(1, RANK3.reason, "algo-2"), StopPart(0)]  # whose ranks failed, told
    assert state.phase == Phase.STOPPING and state.causes == (RANK3.reason,) and state.attempt == 0
    # this attempt's own processes ending while stopped are expected, not failures
    state, actions = run(state, (2.0, LocalExit("script", ExitStatus(-15), 2.0)))
    assert actions == [] and state.failures == ()
    state, actions = run(state, (3.0, PartEnded(0)))
    assert actions == [Rejoin(1, RANK3.reason)] and state.phase == Phase.BARRIER and state.attempt == 1
    state, actions = run(state, (9.0, Started(("script",))))
    assert actions == [] and state.phase == Phase.RUNNING and state.attempt == 1 and state.failures == ()


def test_events_of_an_attempt_already_over_are_stale():
    state, _ = run(master(max_restarts=2), (1.0, PeerFailed("algo-2", "x", 1, at=1.0)), (2.0, Tick()),
                   (3.0, PartEnded(0)), (4.0, Started(("script",))))
    late = (LocalExit("script", KILLED, 5.0, RANK3, attempt=0), PeerFailed("algo-2", "late", 1, at=5.0, attempt=0),
            PartEnded(0))
    for event in late:
        assert step(state, event, 5.0) == (state, ())


def test_after_the_last_restart_the_verdict_lists_every_attempts_cause():
    state, _ = run(master(max_restarts=1), (1.0, PeerFailed("algo-2", RANK3.reason, 137, at=1.0)), (2.0, Tick()),
                   (3.0, PartEnded(0)), (4.0, Started(("script",))))
    own = Outcome(3, "algo-1: train.py exited with code 3")
    state, actions = run(state, (5.0, LocalExit("script", ExitStatus(3), 5.0, own, attempt=1)), (6.0, Tick()))
    reason = f"{own.reason} (attempt 2 of 2; earlier: attempt 1: {RANK3.reason})"
    assert actions[0] == Announce(Verdict(3, reason, "algo-1")) and state.phase == Phase.ENDED
    assert actions[1].outcome.details == ("causes of earlier attempts:", f"attempt 1: {RANK3.reason}")


def test_a_stop_is_never_a_restart():
    # the platform's SIGTERM here: the job ends, whatever restarts are left
    state, actions = run(master(max_restarts=3), (1.0, GotSignal(TERM)), (2.0, LocalExit("script", ExitStatus(0), 2.0)),
                         (3.0, Tick()))
    assert actions[0] == Forward(TERM) and actions[1] == EndLaunchers() and isinstance(actions[2], Announce)
    assert actions[2].verdict.exit_code == 128 + TERM
    # another host's stop, reported: the same
    state, actions = run(master(max_restarts=3),
                         (1.0, PeerFailed("algo-2", "algo-2: stopped by SIGTERM", 143, at=1.0, stopped=True)),
                         (2.0, Tick()))
    assert isinstance(actions[0], Announce) and state.phase == Phase.ENDED


def test_a_stop_while_stopping_for_a_restart_ends_the_job():
    state, _ = run(master(max_restarts=1), (1.0, PeerFailed("algo-2", "x", 1, at=1.0)), (2.0, Tick()))
    state, actions = run(state, (2.5, GotSignal(TERM)), (3.0, PartEnded(0)))
    assert actions[:3] == [Forward(TERM), EndLaunchers(), Announce(Verdict(143, "algo-1: stopped by SIGTERM", "algo-1"), linger=False)]


def test_a_signal_during_the_barrier_interrupts_it_and_a_host_that_never_comes_ends_the_job():
    state, _ = run(master(max_restarts=1), (1.0, PeerFailed("algo-2", "x", 1, at=1.0)), (2.0, Tick()),
                   (3.0, PartEnded(0)))
    assert run(state, (4.0, GotSignal(TERM)))[1] == [Interrupt(TERM)]
    missing = Outcome(69, "algo-1: hosts not ready within 180 s (never joined: algo-2)")
    state, actions = run(state, (183.0, SetupFailed(missing, 183.0)))
    reason = f"{missing.reason} (attempt 2 of 2; earlier: attempt 1: algo-2: x)"
    assert actions[0] == Announce(Verdict(69, reason, "algo-1"))


def test_other_hosts_stop_their_part_and_rejoin_when_told():
    state, actions = run(worker(max_restarts=1), (1.0, LocalExit("script", KILLED, 1.0, RANK3)))
    assert actions == [Report(RANK3.reason, 137, 1.0, 0)] and state.deadline == 1.0 + REPORT_WAIT_S
    state, actions = run(state, (1.6, RestartCalled(1, RANK3.reason)))
    assert actions == [StopPart(0)] and state.phase == Phase.STOPPING and state.deadline is None
    assert run(state, (99.0, Tick()))[1] == []  # its own report is answered: no ending alone
    state, actions = run(state, (2.0, PartEnded(0)))
    assert actions == [Rejoin(1, RANK3.reason)] and state.attempt == 1
    state, actions = run(state, (3.0, Started(("script",))))
    assert state.phase == Phase.RUNNING and state.failures == ()


def test_other_hosts_ignore_a_restart_they_cannot_take_and_end_on_the_verdict_or_a_lost_first_host():
    state = worker(max_restarts=1)
    assert step(state, RestartCalled(5, "x"), 1.0) == (state, ())  # not the next attempt
    stopping, _ = step(state, RestartCalled(1, "x"), 1.0)
    state, actions = run(stopping, (2.0, Verdict(143, "algo-1: stopped by SIGTERM")))
    assert actions == [Finish(Outcome(143, "algo-1: stopped by SIGTERM"))]
    state, actions = run(stopping, (2.0, PeerLost("algo-1", "timed out")))
    assert actions == [Finish(Outcome(69, "algo-2: timed out"))]


def test_a_worker_stopped_for_a_restart_then_by_the_platform_reports_the_stop():
    stopping, _ = step(worker(max_restarts=1), RestartCalled(1, "x"), 1.0)
    state, actions = run(stopping, (1.5, GotSignal(TERM)), (2.0, PartEnded(0)))
    stop = Outcome(143, "algo-2: stopped by SIGTERM")
    assert actions == [Forward(TERM), Report(stop.reason, 143, None, 0, True), Finish(stop)]


def test_replace_keeps_the_tables_honest():
    assert replace(master(), phase=Phase.SETUP).phase == "setup"  # the phases are the strings they always were


def test_a_job_of_one_host_has_no_reports_to_wait_for():
    state = step(lead_state("algo-1", (), max_restarts=1), Started(("rank 0", "rank 1")), 0.0)[0]
    state, actions = run(state, (1.0, LocalExit("rank 1", KILLED, 1.0, RANK3)))
    assert actions == [] and state.deadline == 1.0  # no window: the next Tick concludes
    state, actions = run(state, (1.0, Tick()))
    assert actions == [AnnounceRestart(1, RANK3.reason, "algo-1"), StopPart(0)]


def test_a_worker_whose_restart_barrier_fails_reports_it_bare_and_ends_with_every_cause():
    stopping, _ = step(worker(max_restarts=1), RestartCalled(1, "algo-2 rank 3: boom"), 1.0)
    state, _ = run(stopping, (2.0, PartEnded(0)))
    late = Outcome(69, "algo-2: the lead algo-1 did not start the job within 60 s")
    state, actions = run(state, (70.0, SetupFailed(late, 70.0)))
    mine = f"{late.reason} (attempt 2 of 2; earlier: attempt 1: algo-2 rank 3: boom)"
    assert actions == [Report(late.reason, 69, 70.0, 1), Finish(actions[1].outcome)]  # the first host adds the causes
    assert actions[1].outcome.reason == mine


# A host that rejoins (its train restarted in its pod) ------------------------------------------------------


def test_a_joining_host_takes_the_jobs_attempt_if_not_started_else_the_next():
    from training_toolkit.agent.decisions import attempt_to_join

    table = {(0, False): 0, (0, True): 1, (2, False): 2, (2, True): 3}
    assert {key: attempt_to_join(*key) for key in table} == table


def test_joined_sets_the_attempt_of_a_host_in_setup_only():
    from training_toolkit.agent.decisions import Joined

    rows = [  # (state, event) -> attempt after
        (follower_state("algo-2", 1), Joined(0, False), 0),
        (follower_state("algo-2", 1), Joined(0, True), 1),  # the job runs attempt 0 without it: it comes in at 1
        (follower_state("algo-2", 3), Joined(2, False), 2),  # the restart its loss caused is at its barrier
        (follower_state("algo-2", 1, first_attempt=1), Joined(1, False), 1),  # a JobSet restart: every pod at 1
        (lead_state("algo-1", ("algo-2",), max_restarts=1), Joined(0, True), 0),  # the first host's own
        (worker(1), Joined(0, True), 0),  # running already: a host joins once
    ]
    for state, event, attempt in rows:
        after, actions = step(state, event, 0.0)
        assert (after.attempt, actions, after.phase) == (attempt, (), state.phase), (state, event)


def test_a_rejoined_host_follows_the_attempt_it_came_in_at():
    from training_toolkit.agent.decisions import Joined

    state, _ = run(follower_state("algo-2", 1), (0.0, Joined(0, True)), (0.0, Started(("script",))))
    assert (state.attempt, state.phase) == (1, Phase.RUNNING)
    # the restart its own loss caused, heard after it joined: not a restart of the attempt it runs
    state, actions = run(state, (1.0, RestartCalled(1, "algo-2: left the job")))
    assert actions == [] and state.phase == Phase.RUNNING
    state, actions = run(state, (2.0, LocalExit("script", ExitStatus(3), 2.0, RANK3, attempt=1)))
    assert actions == [Report(RANK3.reason, 137, 2.0, 1)]


def test_a_platform_restart_is_where_the_attempts_start_and_the_restarts_are_the_jobs_own():
    state = step(lead_state("algo-1", ("algo-2",), max_restarts=1, first_attempt=1), Started(("script",)), 0.0)[0]
    assert state.attempt == 1
    state, actions = run(state, (1.0, LocalExit("script", KILLED, 1.0, RANK3, attempt=1)), (2.0, Tick()))
    assert actions == [AnnounceRestart(2, RANK3.reason, "algo-1"), StopPart(1)]  # its one restart is left
    state, actions = run(state, (3.0, PartEnded(1)), (4.0, Started(("script",))),
                         (5.0, LocalExit("script", KILLED, 5.0, RANK3, attempt=2)), (6.0, Tick()))
    assert actions[0] == Rejoin(2, RANK3.reason)
    verdict = actions[-1].outcome
    assert verdict.reason == f"{RANK3.reason} (attempt 3 of 3; earlier: attempt 2: {RANK3.reason})"


def test_a_follower_takes_the_attempt_its_leads_go_started_and_what_the_job_learnt_the_lead_its_own():
    import pytest

    from training_toolkit.agent.decisions import take_seat as seated
    from training_toolkit.job.attempt import Attempt

    waiting = replace(follower_state("algo-2", 3), attempt=1, phase=Phase.BARRIER, cause_hosts=("algo-3",))
    assert seated(waiting, Attempt(1, ("algo-1", "algo-2"), causes=("algo-3",))) == waiting
    went = seated(waiting, Attempt(3, ("algo-1", "algo-2"), causes=("algo-3", None, "algo-4")))
    assert (went.attempt, went.cause_hosts) == (3, ("algo-3", None, "algo-4"))  # the lead went on twice meanwhile
    lead = replace(lead_state("algo-1", ("algo-2",), max_restarts=3), attempt=1, cause_hosts=("algo-2",))
    assert seated(lead, Attempt(2, ("algo-1",))) is lead  # the lead numbers the attempts and keeps the causes itself
    with pytest.raises(AssertionError):
        seated(waiting, Attempt(0, ("algo-1",)))  # an older go is never taken (the seat waits for its own or newer)
