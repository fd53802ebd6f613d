"""Which steps make which entries (agent/recording.observed: pure), and a recorder's end."""

from __future__ import annotations

import signal

from training_toolkit.agent.events import (AnnounceRestart, FailOver, Finish, GatherStacks, GotSignal, LocalExit,
                                           Progress, Say, Started)
from training_toolkit.agent.recording import Recorder, observed
from training_toolkit.job.attempt import Attempt
from training_toolkit.cluster.events import MarkShared, PeerFailed, PeerLost, PeerProgress, Verdict
from training_toolkit.supervise.process import ExitStatus
from training_toolkit.record import schema
from training_toolkit.job.report import Outcome

ACTIVE = ("algo-1", "algo-2", "algo-3")


def see(event, actions=(), attempt=1):
    return observed(event, actions, attempt, ACTIVE, "algo-1")


def test_faults_are_failures_of_the_attempt_losses_of_active_hosts_stalls_and_stops():
    failed = LocalExit("rank", ExitStatus(1), 5.0, Outcome(1, "algo-1: rank 0 exited 1"), attempt=1)
    assert see(failed) == [("fault", {"attempt": 1, "fault": "failure", "host": "algo-1",
                                      "reason": "algo-1: rank 0 exited 1", "at": 5.0})]
    assert see(LocalExit("rank", ExitStatus(1), 5.0, Outcome(1, "x"), attempt=0)) == []  # an earlier attempt's
    assert see(PeerFailed("algo-2", "algo-2: rank 1 exited 3", 3, 4.0, attempt=1))[0][1]["fault"] == "failure"
    assert see(PeerFailed("algo-2", "stopped", 143, 4.0, attempt=1, stopped=True))[0][1]["fault"] == "stop"
    assert see(PeerLost("algo-3", "connection closed", 7.0)) == [
        ("fault", {"attempt": 1, "fault": "host_lost", "host": "algo-3", "reason": "algo-3 lost: connection closed",
                   "at": 7.0})]
    assert see(PeerLost("algo-4", "connection closed"), (Say("a spare lost"),)) == []  # a spare's loss: said only
    assert see(GotSignal(signal.SIGTERM))[0][1] == {"attempt": 1, "fault": "stop", "host": "algo-1",
                                                    "reason": "SIGTERM on algo-1", "at": None}
    assert see(GotSignal(signal.SIGUSR1)) == []
    assert see(None, (GatherStacks(),))[0][1]["fault"] == "stall"
    stopped = LocalExit("rank", ExitStatus(-15), 5.0, Outcome(143, "algo-1: rank 0 terminated by SIGTERM"), attempt=1)
    assert observed(stopped, (), 1, ACTIVE, "algo-1", stopping=True) == []  # a restart's stop: its doing, no fault
    assert observed(PeerLost("algo-3", "connection closed"), (), 1, ACTIVE, "algo-1", stopping=True) != []
    saved = LocalExit("rank", ExitStatus(143), 5.0, Outcome(143, "algo-1 rank 0: train.py exited with code 143"),
                      attempt=1)
    assert see(saved)[0][1]["fault"] == "failure"  # no stop on: an exit 143 is a failure like any other
    assert observed(saved, (), 1, ACTIVE, "algo-1", signalled=True) == []  # a stop's: its save's exit, no fault
    told = PeerFailed("algo-2", "algo-2: stopped by SIGTERM", 143, 5.0, attempt=1, stopped=True)
    assert observed(told, (), 1, ACTIVE, "algo-1", signalled=True)[0][1]["fault"] == "stop"  # each host's stop said


def test_a_stall_began_the_stall_timeout_before_it_was_seen_or_the_startups_before_any_progress(tmp_path):
    recorder = Recorder(tmp_path, "algo-1", stall_s=5.0, startup_s=30.0, clock=lambda: 100.0)
    recorder.step(None, (GatherStacks(),), 0)
    recorder.step(Progress(attempt=1), (), 1)
    recorder.step(None, (GatherStacks(),), 1)
    stalls = [(item["attempt"], item["at"]) for item in recorder.entries if item["kind"] == "fault"]
    assert stalls == [(0, 70.0), (1, 95.0)]


def test_a_steps_entries_carry_the_instant_it_was_decided_not_the_writes(tmp_path):
    recorder = Recorder(tmp_path, "algo-1", stall_s=4.0, clock=lambda: 500.0)
    recorder.step(Progress(attempt=0), (), 0, at=100.25)
    recorder.step(None, (GatherStacks(),), 0, at=104.25)
    recorder.step(Progress(attempt=1), (), 1)  # no instant given: the recorder's clock
    assert [(item["kind"], item["t"]) for item in recorder.entries] == [
        ("progress", 100.25), ("fault", 104.25), ("progress", 500.0)]
    assert recorder.entries[1]["at"] == 100.25  # the stall began the stall timeout before it was decided


def test_progress_starts_restarts_and_the_verdict():
    assert see(Progress(heartbeat=True, attempt=1)) == [("progress", {"attempt": 1, "heartbeat": True})]
    assert see(PeerProgress("algo-2")) == [("progress", {"attempt": 1, "heartbeat": False})]
    assert see(Progress(heartbeat=True, attempt=1, checkpoint=True)) == [
        ("progress", {"attempt": 1, "heartbeat": True}), ("checkpoint", {"attempt": 1, "host": "algo-1", "at": None})]
    # the lead told of it: its attempt and its instant, whatever this host's attempt when it handles it
    assert see(MarkShared("algo-3", 0, 99.1234)) == [("checkpoint", {"attempt": 0, "host": "algo-3", "at": 99.123})]
    assert see(MarkShared("algo-1", 1, 99.0)) == []  # this host's own: recorded when its rank marked it
    assert see(PeerProgress("algo-3", True, checkpoint=True)) == [
        ("progress", {"attempt": 1, "heartbeat": True}), ("checkpoint", {"attempt": 1, "host": "algo-3", "at": None})]
    assert see(Started(("rank",))) == [("started", {"attempt": 1})]
    assert see(None, (AnnounceRestart(2, "algo-2 failed"),)) == [
        ("restart", {"attempt": 2, "reason": "algo-2 failed", "lost": None})]
    assert see(None, (FailOver(2, "lost the lead algo-1", "algo-1"),)) == [
        ("restart", {"attempt": 2, "reason": "lost the lead algo-1", "lost": "algo-1"})]
    assert see(None, (Finish(Outcome(0)),)) == [("verdict", {"exit_code": 0, "reason": None})]


def test_a_recorder_writes_the_first_progress_of_each_attempt_only_and_ends_with_its_cost(tmp_path, capfd):
    clock = iter(float(t) for t in range(100, 200))
    recorder = Recorder(tmp_path, "algo-2", clock=lambda: next(clock))
    recorder.joined(ACTIVE)
    recorder.seated(Attempt(0, ACTIVE))
    for _ in range(3):
        recorder.step(Progress(attempt=0), (), 0)
    for _ in range(2):  # every checkpoint marked is written, not only the first
        recorder.step(Progress(True, 0, checkpoint=True), (), 0)
    recorder.step(Verdict(0, None, "algo-1", summary="summary: the lead's line"), (Finish(Outcome(0)),), 0)
    recorder.end(Outcome(0), quiet=False)
    kinds = [item["kind"] for item in schema.read(recorder.path)]
    assert kinds == ["job", "attempt", "progress", "checkpoint", "checkpoint", "verdict"]
    assert (tmp_path / schema.DIR_NAME / "cost-algo-2.json").exists()
    assert "training-toolkit: summary: the lead's line" in capfd.readouterr().err  # a follower says its lead's


def test_a_job_of_one_seat_that_ran_once_without_a_fault_says_no_line_but_keeps_its_record(tmp_path, capfd):
    recorder = Recorder(tmp_path, "algo-1")
    recorder.seated(Attempt(0, ("algo-1",)))
    recorder.end(Outcome(0), quiet=True)
    assert capfd.readouterr().err == ""
    assert [item["kind"] for item in schema.read(recorder.path)] == ["attempt", "verdict"]


def test_a_hosts_loss_is_one_fault_until_an_attempt_seats_it_again(tmp_path):
    """A lead lost at a barrier is heard there, then again when the next lead's barrier steps the loss: one fault.
    Seated again and lost again: a second fault."""
    recorder = Recorder(tmp_path, "algo-2", clock=lambda: 100.0)
    recorder.seated(Attempt(0, ACTIVE))
    recorder.step(PeerLost("algo-1", "connection closed"), (), 0)
    recorder.step(PeerLost("algo-1", "connection closed", 3.0), (), 1)
    recorder.step(PeerLost("algo-3", "connection closed"), (), 1)  # another host: its own fault
    recorder.seated(Attempt(2, ACTIVE))  # algo-1 back, and seated
    recorder.step(PeerLost("algo-1", "connection closed"), (), 2)
    lost = [(item["attempt"], item["host"]) for item in recorder.entries if item["kind"] == "fault"]
    assert lost == [(0, "algo-1"), (1, "algo-3"), (2, "algo-1")]
