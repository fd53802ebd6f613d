"""The local launchers' one run loop: when hosts are stopped, how long a stop may take, and why."""

from __future__ import annotations

import threading
import time

from training_toolkit.local import run_loop


class FakeHosts:
    """Hosts that end when told to, and record the stops asked of them."""

    def __init__(self, ended: dict[str, float] | None = None) -> None:
        self._ended = dict(ended or {})
        self.stops: list[float] = []

    def ended(self) -> dict[str, float]:
        return self._ended

    def stop(self, kill_after_s: float) -> None:
        self.stops.append(kill_after_s)


def test_hosts_that_all_end_are_never_stopped():
    hosts = FakeHosts({"algo-1": 1.0, "algo-2": 2.0})
    assert run_loop.run(hosts, 2, threading.Event(), timeout_s=60, stop_grace_s=10) is None
    assert hosts.stops == []


def test_a_signal_stops_every_host_with_the_grace_and_the_margin():
    stop = threading.Event()
    stop.set()
    hosts = FakeHosts({"algo-1": 1.0})
    assert run_loop.run(hosts, 2, stop, timeout_s=60, stop_grace_s=10) == "interrupted"
    assert hosts.stops == [10 + run_loop.STOP_MARGIN_S]


def test_the_deadline_stops_the_hosts_and_says_when():
    hosts = FakeHosts()
    began = time.monotonic()
    assert run_loop.run(hosts, 1, threading.Event(), timeout_s=0.1, stop_grace_s=0) == "timed out after 0.1 s"
    assert 0.1 <= time.monotonic() - began < 5 and hosts.stops == [run_loop.STOP_MARGIN_S]


def test_abort_on_exit_stops_the_others_once_the_first_host_ended_and_names_it():
    hosts = FakeHosts({"algo-2": 5.0, "algo-3": 3.0})
    why = run_loop.run(hosts, 3, threading.Event(), timeout_s=60, stop_grace_s=1, abort_on_exit=True)
    assert why == "algo-3 exited (abort on exit)" and hosts.stops == [1 + run_loop.STOP_MARGIN_S]
    assert run_loop.run(FakeHosts({"algo-2": 5.0}), 3, threading.Event(), timeout_s=0.05, stop_grace_s=1) \
        == "timed out after 0.05 s"  # without abort_on_exit one ended host changes nothing


def test_each_host_gets_the_launchers_grace_as_its_own():
    assert run_loop.grace_environment(10) == {"TRAINING_TOOLKIT_GRACE_PERIOD": "10"}
    assert run_loop.grace_environment(2.5) == {"TRAINING_TOOLKIT_GRACE_PERIOD": "2.5"}
