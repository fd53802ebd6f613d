"""The local launcher's hosts as containers (``run_local(restart=...)``): when a train ends, starts again, ends."""

from __future__ import annotations

import time

from training_toolkit.local.launcher import _Trains


class FakeTrain:
    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode


def trains(policy, left=()):
    started, ended_remains = [], []

    def start(name):
        started.append(name)
        t.procs[name] = FakeTrain()

    def end_remains(name):
        ended_remains.append(name)
        return list(left)

    t = _Trains(policy, start, end_remains)
    return t, started, ended_remains


def test_a_train_that_ends_is_started_again_when_due_and_its_remains_are_ended_each_time():
    t, started, ended_remains = trains(lambda name, code: 0.0 if code != 0 else None)
    t.procs["a"] = FakeTrain(-9)
    assert t.ended() == {} and ended_remains == ["a"]  # due now: restarted at the next look
    assert t.ended() == {} and started == ["a"]
    t.procs["a"].returncode = 0
    assert set(t.ended()) == {"a"} and ended_remains == ["a", "a"] and started == ["a"]


def test_a_restart_waits_for_its_back_off():
    t, started, _ = trains(lambda name, code: 30.0)
    t.procs["a"] = FakeTrain(1)
    t.ended()
    t.ended()
    assert started == [] and "a" not in t.ended()


def test_remains_count_as_survivors_only_when_train_exited_on_its_own():
    t, _, _ = trains(lambda name, code: None, left=["123 python rank.py"])
    t.procs["killed"] = FakeTrain(-9)  # killed: what it started could not be ended by it
    t.procs["exited"] = FakeTrain(69)
    assert set(t.ended()) == {"killed", "exited"}
    assert t.remains == {"exited": ["123 python rank.py"]}


def test_a_stop_cancels_every_pending_restart():
    t, started, _ = trains(lambda name, code: 0.0)
    t.procs["a"] = FakeTrain(1)
    t.ended()
    t0 = time.monotonic()
    t.stop(kill_after_s=1.0)
    assert "a" in t.ended() and started == [] and time.monotonic() - t0 < 1.0
