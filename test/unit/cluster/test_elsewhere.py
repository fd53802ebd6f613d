"""Finding the job under another lead (``cluster/elsewhere.running_job``), with clients that only say what a host
would answer: every host is asked, side by side, and the first in the platform's order that leads a started job is
followed."""

from __future__ import annotations

import threading
import time

from training_toolkit.cluster import elsewhere


class Answer:
    """A host's answer to one join: ``serves`` (None: nobody serves there), the attempt it leads and whether it started."""

    def __init__(self, host: str, serves: tuple[int, bool] | None, delay_s: float = 0.0):
        self.host, self.serves, self.delay_s = host, serves, delay_s
        self.closed = self.asked = False
        self.job_attempt = serves or (0, False)

    def try_join(self, timeout: float) -> bool:
        assert timeout == elsewhere.PROBE_S
        self.asked = True
        time.sleep(self.delay_s)
        return self.serves is not None

    def close(self) -> None:
        self.closed = True


def look(answers: dict[str, tuple[int, bool] | None], first_attempt: int = 0, delay_s: float = 0.0):
    clients = {host: Answer(host, serves, delay_s) for host, serves in answers.items()}
    found = elsewhere.running_job(lambda host: clients[host], list(answers), first_attempt)
    return found, clients


def test_at_a_jobs_start_nobody_serves_and_nothing_is_joined():
    found, clients = look({f"algo-{i}": None for i in range(2, 9)})
    assert found is None and not any(c.closed for c in clients.values())


def test_the_lead_after_more_losses_than_three_is_found_past_the_next_three_hosts():
    found, _ = look({"algo-2": None, "algo-3": None, "algo-4": None, "algo-5": None, "algo-6": (5, True)})
    assert found is not None and found.host == "algo-6" and not found.closed


def test_a_host_that_serves_a_job_not_started_yet_is_no_running_job_and_its_link_is_closed():
    found, clients = look({"algo-2": (0, False), "algo-3": None})
    assert found is None and clients["algo-2"].closed
    found, clients = look({"algo-2": (3, False)}, first_attempt=2)  # the platform's restart attempt 2: attempt 3 runs
    assert found is clients["algo-2"] and not found.closed


def test_the_first_lead_in_the_platforms_order_is_followed_and_another_is_let_go():
    hosts = {f"algo-{i}": None for i in range(2, 40)}  # algo-2 to algo-17 asked first, side by side
    hosts.update({"algo-12": (4, True), "algo-7": (4, True), "algo-31": (4, True)})  # never so, by succession's rule
    found, clients = look(hosts)
    assert found is clients["algo-7"] and not found.closed and clients["algo-12"].closed
    assert not clients["algo-31"].closed and clients["algo-31"].asked is False  # a later batch: never asked


def test_the_hosts_are_asked_side_by_side_so_many_at_a_time():
    """The first PROBES_AT_ONCE hosts are all in their join at once (each waits for the others); the next only once
    they are done."""
    together = threading.Barrier(elsewhere.PROBES_AT_ONCE, timeout=30)
    broken: list[str] = []
    ended: dict[str, float] = {}
    began: dict[str, float] = {}

    class Together(Answer):
        def try_join(self, timeout: float) -> bool:
            began[self.host] = time.monotonic()
            if len(ended) < elsewhere.PROBES_AT_ONCE:  # the first batch
                try:
                    together.wait()
                except threading.BrokenBarrierError:
                    broken.append(self.host)
            ended[self.host] = time.monotonic()
            return False

    hosts = [f"algo-{i}" for i in range(2, 2 + elsewhere.PROBES_AT_ONCE + 1)]
    assert elsewhere.running_job(lambda host: Together(host, None), hosts, 0) is None
    assert broken == [] and len(ended) == len(hosts)
    assert began[hosts[-1]] >= max(ended[host] for host in hosts[:-1])


def test_a_host_out_of_the_job_asks_again_until_a_lead_answers(monkeypatch):
    """``look_for``: the cut mends after two rounds (algo-3 serves from the third on): found, and no round after."""
    monkeypatch.setattr(elsewhere, "LOOK_S", 0.01)
    rounds: list[str] = []

    def client_for(host: str) -> Answer:
        rounds.append(host)
        return Answer(host, (2, True) if host == "algo-3" and len(rounds) > 4 else None)

    found = elsewhere.look_for(client_for, ["algo-2", "algo-3"], 0, 30.0, threading.Event())
    assert found is not None and found.host == "algo-3" and not found.closed
    assert sorted(rounds) == ["algo-2"] * 3 + ["algo-3"] * 3  # three rounds, every host in each


def test_a_host_out_of_the_job_stops_looking_at_its_window_or_its_stop(monkeypatch):
    monkeypatch.setattr(elsewhere, "LOOK_S", 0.01)
    asked: list[str] = []

    def nobody(host: str) -> Answer:
        asked.append(host)
        return Answer(host, None)

    began = time.monotonic()
    assert elsewhere.look_for(nobody, ["algo-2"], 0, 1.0, threading.Event()) is None
    assert 1.0 <= time.monotonic() - began < 6 and len(asked) >= 2  # asked again within the window, not past it
    stopped = threading.Event()
    stopped.set()
    asked.clear()
    assert elsewhere.look_for(nobody, ["algo-2"], 0, 60.0, stopped) is None and asked == []  # a stop: no more rounds
