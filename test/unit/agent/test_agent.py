"""The agent's shell in a fake job: its seat is a fake (no sockets, no root); its runner a spec; its processes real and short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from training_toolkit.supervise import procfs

from training_toolkit.config import settings
from training_toolkit.agent.loop import HostAgent
from training_toolkit.cluster.events import PeerFailed, PeerJoined, PeerReady, Verdict
from training_toolkit.core.errors import ClusterError, CodeError
from training_toolkit.core.hardware import Hardware
from training_toolkit.job.spec import build_job
from training_toolkit.core.paths import Paths
from training_toolkit.job.plan import LaunchPlan
from training_toolkit.supervise.process import Supervised
from training_toolkit.core.errors import JobFailed
from training_toolkit.job.report import Outcome
from training_toolkit.job.attempt import seated
from training_toolkit.runspec import Blamed, Local, Proc, RunContext, RunnerSpec

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

HOSTS = ("algo-1", "algo-2", "algo-3")


class FakeSeat:
    """A seat in a job that exists only in this test: what the agent told it is in ``told``."""

    def __init__(self, secret, hosts, current, channel_settings, events, introduction, *, answer=None,
                 fail_barrier=None, welcomed=None, active=None, ready=None):
        self.hosts, self.current, self.events = tuple(hosts), current, events
        self._welcomed = welcomed  # the hosts the first host's welcome lists (None: this host's own)
        self.is_lead = current == self.hosts[0]
        self.job_id = "fake-job"
        self.job_attempt = (0, False)
        self.introductions = {}
        self.told: list = []
        self.deadlines: list = []  # each barrier's deadline_s
        self._answer = answer  # what the first host answers a report with
        self._fail_barrier = fail_barrier
        self._active = active  # the attempt's active hosts, as the first host's go names them (None: not said)
        self._ready = ready  # first host: the other hosts its channel says joined and are ready (None: every one)
        self._releases = 0

    def open(self):
        self.told.append("open")
        if self._welcomed is not None:
            self.hosts = tuple(self._welcomed)
        if self.is_lead:  # what the first host's channel would post: the others joined and said ready
            for host in self.hosts[1:] if self._ready is None else self._ready:
                self.events.put(PeerJoined(host))
                self.events.put(PeerReady(host, 0))

    def barrier(self, attempt=0, deadline_s=None):
        self.told.append("barrier" if attempt == 0 else ("barrier", attempt))
        self.deadlines.append(deadline_s)
        if self._fail_barrier:
            raise self._fail_barrier
        return seated(attempt, self.hosts, self._active)

    def release(self, attempt):
        """The first host's barrier passed (the agent decided it): the go, with the attempt's active hosts."""
        self.told.append("barrier" if not self._releases else ("barrier", self._releases))
        self._releases += 1

    def report_failure(self, reason, exit_code, at=None, attempt=0, stopped=False):
        self.told.append(("failed", reason, exit_code, at))
        if self._answer:
            self.events.put(self._answer)

    def report_done(self, exit_code):
        self.told.append(("done", exit_code))
        if self._answer:
            self.events.put(self._answer)

    def fail(self, reason, exit_code, at=None):
        self.told.append(("fail", reason, exit_code))

    def announce(self, verdict, linger=True):
        self.told.append(("verdict", verdict) if linger else ("verdict", verdict, "no linger"))

    def restart(self, attempt, reason, cause=None):
        self.told.append(("restart", attempt, reason))

    def progress(self, heartbeat):
        self.told.append(("progress", heartbeat))

    def request_stacks(self, timeout_s):
        return {}

    def send_stacks(self, stacks):
        self.told.append(("stacks", stacks))

    def interrupt(self):
        self.told.append("interrupt")

    def close(self):
        self.told.append("close")


def context(tmp_path: Path, current: str) -> RunContext:
    paths = Paths(tmp_path / "opt_ml")
    job = build_job(paths, {}, {"current_host": current, "hosts": list(HOSTS)}, {}, {}, Hardware(1, 0, 0))
    plan = LaunchPlan("multi_worker_mirrored", HOSTS, current)
    return RunContext(job, plan, settings.parse({}), {}, {}, (), tmp_path, sys.executable)


def script(code: str = "pass", **fields) -> RunnerSpec:
    """A runner that runs one python snippet as its script."""
    return RunnerSpec(lambda seat: [Proc("script", (sys.executable, "-c", code), {})], **fields)


def script_agent(ctx: RunContext, factory, code: str = "pass", **fields) -> HostAgent:
    return HostAgent(ctx, script(code, **fields), factory)


def seat_factory(seats: list, **kw):
    def make(*args):
        seat = FakeSeat(*args, **kw)
        seats.append(seat)
        return seat
    return make


def test_the_first_host_names_an_earlier_failure_that_arrived_later(tmp_path):
    """Its own script fails first in arrival, but algo-3 reports a failure from before it."""
    seats: list[FakeSeat] = []
    earlier = PeerFailed("algo-3", "algo-3: train.py exited with code 7", 7, at=time.time() - 0.2)
    exited = tmp_path / "exited"
    agent = script_agent(context(tmp_path, "algo-1"), seat_factory(seats),
                        f"import os, sys; open({str(exited)!r}, 'w').write(str(os.getpid())); sys.exit(3)")
    events = agent.events

    def arrives_late() -> None:
        # Once the script has exited (not after a fixed time, which a loaded machine can overrun):
        # inside the window (FAILURE_WINDOW_S) the agent opens on seeing that exit.
        deadline = time.monotonic() + 30
        while not (exited.exists() and exited.read_text()) or procfs.alive(int(exited.read_text())):
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        events.put(earlier)

    threading.Thread(target=arrives_late, daemon=True).start()
    outcome = agent.run()
    assert outcome.exit_code == 7 and outcome.reason == "algo-3: train.py exited with code 7"
    assert seats[0].told == ["open", "barrier", ("verdict", Verdict(7, outcome.reason, "algo-1")), "close"]


def test_the_first_host_announces_its_own_success(tmp_path):
    seats: list[FakeSeat] = []
    assert script_agent(context(tmp_path, "algo-1"), seat_factory(seats)).run() == Outcome(0)
    assert seats[0].told == ["open", "barrier", ("verdict", Verdict(0, None, "algo-1")), "close"]


def test_another_host_reports_its_failure_with_when_it_happened_and_takes_the_verdict(tmp_path):
    seats: list[FakeSeat] = []
    verdict = Verdict(9, "algo-3: earlier", "algo-1")
    agent = script_agent(context(tmp_path, "algo-2"), seat_factory(seats, answer=verdict),
                        "import sys; sys.stderr.write('ValueError: boom\\n'); sys.exit(2)")
    before = time.time()
    assert agent.run() == Outcome(9, "algo-3: earlier")
    (kind, reason, code, at), = [t for t in seats[0].told if isinstance(t, tuple)]
    assert (kind, code) == ("failed", 2) and reason.startswith("algo-2: ")
    assert reason.endswith(" exited with code 2: ValueError: boom")
    assert before < at < time.time()


def test_another_host_reports_done_then_ends_with_the_verdict(tmp_path):
    seats: list[FakeSeat] = []
    agent = script_agent(context(tmp_path, "algo-2"), seat_factory(seats, answer=Verdict(0, None, "algo-1")))
    assert agent.run() == Outcome(0)
    assert seats[0].told == ["open", "barrier", ("done", 0), "close"]


def test_a_failed_barrier_is_told_to_the_job(tmp_path):
    seats: list[FakeSeat] = []
    agent = script_agent(context(tmp_path, "algo-2"),
                        seat_factory(seats, fail_barrier=ClusterError("the lead algo-1 did not start the job")))
    outcome = agent.run()
    assert outcome == Outcome(69, "algo-2: the lead algo-1 did not start the job")
    assert seats[0].told[:2] == ["open", "barrier"] and seats[0].told[-1] == "close"
    (kind, reason, code, at), = [t for t in seats[0].told if isinstance(t, tuple)]
    assert (kind, reason, code) == ("failed", outcome.reason, 69) and at is not None


@pytest.mark.parametrize("host, told", [
    ("algo-1", ["open", ("verdict", Verdict(66, "algo-1: cannot install", "algo-1")), "close"]),
    ("algo-2", ["open", ("failed", "algo-2: cannot install", 66), "close"]),
])
def test_a_host_that_cannot_take_part_joins_to_say_so_as_a_setup_failure(tmp_path, host, told):
    """Its code did not install: no more fail_job beside the agent, one setup failure inside it."""
    seats: list[FakeSeat] = []
    ctx = context(tmp_path, host)._replace(setup_error=CodeError(f"{host}: cannot install"))
    outcome = script_agent(ctx, seat_factory(seats)).run()
    assert outcome == Outcome(66, f"{host}: cannot install")
    assert [t[:3] if isinstance(t, tuple) and t[0] == "failed" else t for t in seats[0].told] == told


@pytest.mark.parametrize("rank, program, reason", [
    (3, True, "algo-2 rank 3: sh exited with code 5"),
    (None, True, "algo-2: sh exited with code 5"),
    (None, False, "algo-2: parameter server exited with code 5"),
])
def test_failure_of_names_a_process_by_its_data_not_its_name(tmp_path, rank, program, reason):
    agent = HostAgent(context(tmp_path, "algo-2"), RunnerSpec(lambda seat: []), seat_factory([]))
    child = Supervised(["/bin/sh", "-c", "exit 5"], {})
    status = child.wait()
    local = Local("parameter server" if not program else "anything", child, rank=rank, program=program)
    blamed = agent.failure_of(local, status)
    assert blamed.outcome.reason == reason and blamed.host is None  # this host's own: no other host is blamed


def seen_by(seen: list):
    """A runner's prepare that records the hosts everything after the join reads: the plan's, the script's contract,
    /opt/ml's file."""
    from contextlib import contextmanager

    @contextmanager
    def prepare(seat):
        import json

        ctx = seat.ctx
        seen.append((ctx.plan.hosts, json.loads(ctx.script_env["SM_HOSTS"]),
                     json.loads(ctx.job.paths.resource_config_file.read_text())["hosts"]))
        yield
    return prepare


def test_a_host_other_than_the_first_takes_the_jobs_hosts_from_the_first_host(tmp_path):
    """Issue 24: an MPIJob worker's own view is the launcher and itself; the job is what the first host says."""
    from training_toolkit.job import contract
    from training_toolkit.core import names
    from training_toolkit.job import plan
    from training_toolkit.platforms.opt_ml import write_view
    from training_toolkit.platforms.view import JobView

    paths = Paths(tmp_path / "opt_ml")
    own = ("algo-1", "algo-3")  # what this host could see of the job
    switch = {names.distribution("multi_worker_mirrored").switch: "true"}
    write_view(paths, JobView("test", own, "algo-3", hyperparameters=switch))
    spec = build_job(paths, switch, {"current_host": "algo-3", "hosts": list(own), "network_interface_name": "eth0"},
                     {}, {}, Hardware(1, 0, 0))
    ctx = RunContext(spec, plan.make_plan(spec), settings.parse({}), {}, contract.script_environment(spec, {}), (),
                     tmp_path, sys.executable)
    seats: list[FakeSeat] = []
    seen: list = []
    agent = script_agent(ctx, seat_factory(seats, answer=Verdict(0, None, "algo-1"), welcomed=HOSTS),
                        prepare=seen_by(seen))
    assert agent.run() == Outcome(0)
    assert seen == [(HOSTS, list(HOSTS), list(HOSTS))]
    assert agent.ctx.job.resource.current_host == "algo-3" and agent.hosts == HOSTS


def test_a_welcome_that_does_not_list_this_host_is_a_setup_failure(tmp_path):
    seats: list[FakeSeat] = []
    ctx = context(tmp_path, "algo-2")
    agent = script_agent(ctx, seat_factory(seats, welcomed=("algo-1", "algo-3")))
    outcome = agent.run()
    assert outcome.exit_code == 78 and "algo-2" in outcome.reason and "current_host" in outcome.reason
    assert seats[0].told[0] == "open" and "barrier" not in seats[0].told


def test_what_a_runner_prepared_is_let_go_after_its_processes_end_and_before_the_seat_closes(tmp_path):
    """The job's stack, reversed: the attempt's processes, then what the runner prepared, then the seat."""
    from contextlib import contextmanager

    seats: list[FakeSeat] = []
    order: list = []

    @contextmanager
    def prepare(seat):
        order.append(("prepared", seat.job_id, seat.leads, seat.attempt, list(seats[0].told)))
        yield
        order.append(("let go", [local.child.poll() is not None for local in agent.locals], list(seats[0].told)))

    agent = script_agent(context(tmp_path, "algo-1"), seat_factory(seats), prepare=prepare)
    assert agent.run() == Outcome(0)
    verdict = ("verdict", Verdict(0, None, "algo-1"))
    assert order == [("prepared", "fake-job", True, seated(0, HOSTS), ["open"]),
                     ("let go", [True], ["open", "barrier", verdict])]
    assert seats[0].told[-1] == "close"


RANK = """
import os, signal, sys, time
def term(*_):
    held = os.path.exists(os.environ["TRAINING_TOOLKIT_RANK_STOP_FLAG"])
    open(sys.argv[1], "a").write("rank held\\n" if held else "rank not held\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, term)
open(sys.argv[2], "w").close()
time.sleep(60)
"""
PROGRAM = """
import os, signal, subprocess, sys, time
log, started = sys.argv[1], sys.argv[2]
ready = started + ".rank"
rank = subprocess.Popen([sys.executable, "-c", sys.argv[3], log, ready], start_new_session=True)  # not in our group
while not os.path.exists(ready):
    time.sleep(0.005)
start = open(f"/proc/{rank.pid}/stat").read().rsplit(")", 1)[1].split()[19]  # field 22: its start time
where = os.environ["TRAINING_TOOLKIT_RANKS_DIR"]  # reported as training-toolkit-rank reports a rank
open(f"{where}/.tmp", "w").write(f"3 {start}\\n")
os.rename(f"{where}/.tmp", f"{where}/{rank.pid}")
def term(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second stop passes its signal on too: said once
    open(log, "a").write("program\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, term)
open(started, "w").close()
time.sleep(60)
"""
LAUNCHER = """
import signal, sys, time
def term(*_):
    open(sys.argv[1], "a").write("launcher\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open(sys.argv[2], "w").close()
time.sleep(60)
"""


def test_a_stop_signals_the_programs_and_the_reported_ranks_then_the_launcher_ends(tmp_path):
    """One stop for every runner (agent/parts.py): the stop flag first, then the signal to the programs and to a rank
    that is not the agent's child (reported, as MPI's are), each once; the launcher is ended after them."""
    import signal

    seats: list[FakeSeat] = []
    log, started, launched = tmp_path / "log", tmp_path / "started", tmp_path / "launched"

    def processes(seat):
        return [Proc("program", (sys.executable, "-c", PROGRAM, str(log), str(started), RANK), {}),
                Proc("launcher", (sys.executable, "-c", LAUNCHER, str(log), str(launched)), {}, program=False,
                     primary=False)]

    verdict = Verdict(128 + signal.SIGTERM, "algo-2: stopped by SIGTERM", "algo-1")
    agent = HostAgent(context(tmp_path, "algo-2"), RunnerSpec(processes), seat_factory(seats, answer=verdict))

    def signals() -> None:
        deadline = time.monotonic() + 30
        while not (started.exists() and launched.exists()) and time.monotonic() < deadline:  # every handler set
            time.sleep(0.005)
        agent.events.put(decisions_event("GotSignal", signal.SIGTERM))
        agent.events.put(decisions_event("GotSignal", signal.SIGTERM))

    threading.Thread(target=signals, daemon=True).start()
    outcome = agent.run()
    said = log.read_text().splitlines()
    assert sorted(said[:2]) == ["program", "rank held"] and said[2:] == ["launcher"]
    assert outcome.exit_code == 128 + signal.SIGTERM
    (kind, _, code, _), = [t for t in seats[0].told if isinstance(t, tuple)]
    assert (kind, code) == ("failed", 128 + signal.SIGTERM)


def decisions_event(name: str, *args):
    from training_toolkit.agent import decisions

    return getattr(decisions, name)(*args)


def test_a_process_judges_its_own_end(tmp_path):
    """mpirun's exit 0 after a lost daemon is a failure, told by the process's own judge (``mpirun_judge``)."""
    seats: list[FakeSeat] = []
    judged: list = []

    def judge(local, status):
        judged.append((local.name, status.exit_code))
        return Blamed(Outcome(14, f"{local.name}: lost a daemon"))

    spec = RunnerSpec(lambda seat: [Proc("script", (sys.executable, "-c", "pass"), {}, judge=judge)])
    agent = HostAgent(context(tmp_path, "algo-1"), spec, seat_factory(seats))
    assert agent.run() == Outcome(14, "script: lost a daemon")
    assert judged == [("script", 0)]


# Spares and a job that shrinks: what each host takes from the attempt's active hosts --------------------


def test_a_spare_starts_nothing_and_ends_with_the_jobs_verdict(tmp_path, capsys):
    seats: list[FakeSeat] = []
    started = []
    agent = HostAgent(context(tmp_path, "algo-3"), RunnerSpec(lambda seat: started.append(seat) or []),
                      seat_factory(seats, active=("algo-1", "algo-2")))
    agent.events.put(Verdict(0, None, "algo-1"))
    assert agent.run() == Outcome(0)
    assert started == [] and agent.locals == []
    assert "algo-3: a spare: waiting (attempt 1 runs on algo-1, algo-2)" in capsys.readouterr().err


def test_an_active_host_of_a_shrunk_attempt_sees_only_the_active_hosts_renumbered(tmp_path):
    seats: list[FakeSeat] = []
    seen = []

    def processes(seat):
        seen.append((seat.ctx.job.resource.hosts, seat.ctx.script_env.get("SM_HOSTS")))
        return [Proc("script", (sys.executable, "-c", "pass"), {})]

    ctx = context(tmp_path, "algo-3")
    ctx.job.paths.resource_config_file.parent.mkdir(parents=True)  # /opt/ml/input/config, as a platform makes it
    agent = HostAgent(ctx._replace(script_env={"X": "1"}), RunnerSpec(processes),
                      seat_factory(seats, active=("algo-1", "algo-3"), answer=Verdict(0, None, "algo-1")))
    assert agent.run() == Outcome(0)
    assert seen == [(("algo-1", "algo-3"), '["algo-1","algo-3"]')]
    import json
    assert json.loads(ctx.job.paths.resource_config_file.read_text())["hosts"] == ["algo-1", "algo-3"]
    assert agent.ctx.plan.hosts == agent.ctx.job.resource.hosts == HOSTS  # the job's every host, for what admits peers (a spare may be seated)


@pytest.mark.parametrize("env, said", [
    ({"TRAINING_TOOLKIT_MAX_HOSTS": "4"}, "TRAINING_TOOLKIT_MAX_HOSTS=4 is more than the job's 3 host(s)"),
    ({"TRAINING_TOOLKIT_MAX_HOSTS": "2", "TRAINING_TOOLKIT_MIN_HOSTS": "3"},
     "TRAINING_TOOLKIT_MIN_HOSTS=3 is more than TRAINING_TOOLKIT_MAX_HOSTS=2"),
])
def test_limits_out_of_order_end_the_job_before_anything_starts_with_exit_78(tmp_path, env, said):
    seats: list[FakeSeat] = []
    started = []
    ctx = context(tmp_path, "algo-1")
    agent = HostAgent(ctx._replace(settings=settings.parse(env)), RunnerSpec(lambda seat: started.append(seat) or []),
                      seat_factory(seats))
    outcome = agent.run()
    assert outcome.exit_code == 78 and said in outcome.reason and "algo-1, algo-2, algo-3" in outcome.reason
    assert started == [] and "barrier" not in seats[0].told


def test_the_first_host_seats_the_first_roster_and_says_the_attempts_line(tmp_path, capsys):
    seats: list[FakeSeat] = []
    seen = []
    ctx = context(tmp_path, "algo-1")
    ctx.job.paths.resource_config_file.parent.mkdir(parents=True)
    agent = HostAgent(ctx._replace(settings=settings.parse({"TRAINING_TOOLKIT_MAX_HOSTS": "2"})),
                      RunnerSpec(lambda seat: seen.append(seat.ctx.job.resource.hosts) or [
                          Proc("script", (sys.executable, "-c", "pass"), {})]), seat_factory(seats))
    assert agent.run() == Outcome(0)
    assert seen == [("algo-1", "algo-2")]
    assert "algo-1: attempt 1 of 1: algo-1, algo-2 (spares: algo-3)" in capsys.readouterr().err


def test_a_job_of_one_seat_has_no_spares(tmp_path):
    """The single runner: each host is its own job; the settings do not apply to it."""
    ctx = context(tmp_path, "algo-1")
    spec = RunnerSpec(lambda seat: [Proc("script", (sys.executable, "-c", "pass"), {})], solo=True)
    agent = HostAgent(ctx._replace(settings=settings.parse({"TRAINING_TOOLKIT_MAX_HOSTS": "2"})), spec)
    assert agent.run() == Outcome(0) and agent.active == ("algo-1",) and not agent.elastic


# The first host's barrier: the loop, on the channel's events and Ticks ---------------------------------------------


def test_the_first_hosts_barrier_deadline_is_decided_on_a_tick_and_names_who_is_missing(tmp_path):
    seats: list[FakeSeat] = []
    ctx = context(tmp_path, "algo-1")
    started = []
    agent = HostAgent(ctx._replace(settings=settings.parse({"TRAINING_TOOLKIT_JOIN_TIMEOUT": "1"})),
                      RunnerSpec(lambda seat: started.append(seat) or []), seat_factory(seats, ready=("algo-2",)))
    t0 = time.monotonic()
    outcome = agent.run()
    assert outcome == Outcome(69, "algo-1: hosts not ready within 1 s (never joined: algo-3)")
    assert 1.0 <= time.monotonic() - t0 < 5 and started == []
    assert seats[0].told == ["open", ("verdict", Verdict(69, outcome.reason, "algo-1")), "close"]


def test_a_stop_during_the_first_hosts_barrier_is_an_event_that_ends_setup(tmp_path):
    """The signal's handler only posts it; the loop's step says Interrupt, and nothing has started."""
    import os
    import signal

    seats: list[FakeSeat] = []
    started = []
    agent = HostAgent(context(tmp_path, "algo-1"), RunnerSpec(lambda seat: started.append(seat) or []),
                      seat_factory(seats, ready=()))  # no host ever comes: the barrier waits its 180 s
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.monotonic()
    outcome = agent.run()
    timer.join()
    assert outcome == Outcome(143, "algo-1: stopped by SIGTERM before the job started")
    assert time.monotonic() - t0 < 5 and started == []
    # told without waiting for hosts on their way: the platform stops them too, and would kill this one first
    assert seats[0].told == ["open", ("verdict", Verdict(143, outcome.reason, "algo-1"), "no linger"), "close"]


# A stop during a host's blocking setup steps: the handler posts it, the seat's wait ends, the loop steps it --------


def stop_soon(delay_s: float = 0.5) -> threading.Timer:
    import os
    import signal

    timer = threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_seat_context(tmp_path, port: int, hosts) -> tuple[RunContext, tuple[str, ...]]:
    env = {"TRAINING_TOOLKIT_CONTROL_PORT": str(port), "TRAINING_TOOLKIT_JOB_SECRET": "s" * 32}
    ctx = context(tmp_path, "algo-2")
    ctx.job.paths.resource_config_file.parent.mkdir(parents=True)  # the first host's hosts are written there
    return ctx._replace(settings=settings.parse(env)), tuple(hosts)


def test_a_stop_while_joining_ends_the_join_at_once_and_is_the_verdict_here(tmp_path):
    """No first host listens: the join would retry for its 180 s; the stop ends it within a retry."""
    ctx, hosts = real_seat_context(tmp_path, free_port(), ("127.0.0.1", "algo-2"))
    started = []
    agent = HostAgent(ctx, RunnerSpec(lambda seat: started.append(seat) or []), hosts=hosts)
    timer = stop_soon()
    t0 = time.monotonic()
    outcome = agent.run()
    timer.join()
    assert outcome == Outcome(143, "algo-2: stopped by SIGTERM before the job started")
    assert time.monotonic() - t0 < 5 and started == []


def test_a_stop_while_waiting_for_the_go_ends_the_wait_and_the_first_host_hears_it(tmp_path):
    """Joined and ready, the first host never says go: the stop ends the wait, reported as a stop."""
    from queue import SimpleQueue

    from training_toolkit.cluster.server import ControlServer

    port, first_events = free_port(), SimpleQueue()
    server = ControlServer(b"s" * 32, ["algo-2"], port, first_events, bind="127.0.0.1", hosts=("127.0.0.1", "algo-2"))
    server.start()
    try:
        ctx, hosts = real_seat_context(tmp_path, port, ("127.0.0.1", "algo-2"))
        agent = HostAgent(ctx, RunnerSpec(lambda seat: []), hosts=hosts)
        timer = stop_soon(1.0)
        t0 = time.monotonic()
        outcome = agent.run()
        timer.join()
        assert outcome == Outcome(143, "algo-2: stopped by SIGTERM before the job started")
        assert time.monotonic() - t0 < 5
        seen = []  # the report crosses the socket: the first host's reader posts it within a moment
        while not any(isinstance(e, PeerFailed) for e in seen) and len(seen) < 10:
            seen.append(first_events.get(timeout=5))
        assert [type(e).__name__ for e in seen][:2] == ["PeerJoined", "PeerReady"]
        failed = [e for e in seen if isinstance(e, PeerFailed)]
        assert [(e.host, e.reason, e.exit_code) for e in failed] == [("algo-2", outcome.reason, 143)]
    finally:
        server.close()


def test_a_stop_during_the_runners_prepare_never_raises_into_it(tmp_path):
    """What the runner prepares (sshd starting, say) is made and let go: the stop is stepped after it, not raised
    inside it."""
    from contextlib import contextmanager

    order = []

    @contextmanager
    def prepare(seat):
        os.kill(os.getpid(), signal.SIGTERM)  # in prepare: its handler runs here, before the next line
        order.append("held")  # a handler that raised would have ended the hold above, half made
        try:
            yield
        finally:
            order.append("let go")

    seats: list[FakeSeat] = []
    agent = HostAgent(context(tmp_path, "algo-1"), RunnerSpec(lambda seat: order.append("started") or [], prepare=prepare),
                      seat_factory(seats))
    outcome = agent.run()
    assert outcome == Outcome(143, "algo-1: stopped by SIGTERM before the job started")
    assert order == ["held", "let go"] and "barrier" not in seats[0].told and "interrupt" in seats[0].told


@pytest.mark.parametrize("env, deadline", [
    ({"TRAINING_TOOLKIT_MAX_HOSTS": "2"}, float("inf")),  # a spare until a restart seats it, however long that is
    ({}, 180.0 + 5.0),  # the restart its own loss caused: the join deadline plus the grace
])
def test_a_host_that_rejoins_a_started_attempt_waits_for_the_next_barrier_without_a_deadline_when_it_may_be_a_spare(
        tmp_path, env, deadline):
    """A Kubernetes pod made again under its name joins a job that went on without it (docs/kubernetes.md)."""
    seats: list[FakeSeat] = []

    def rejoining(*args):
        seat = FakeSeat(*args, active=("algo-1", "algo-2"), answer=Verdict(0, None, "algo-1"))
        seat.job_attempt = (1, True)  # attempt 2 of the job runs: this host takes part in the next
        seats.append(seat)
        return seat

    ctx = context(tmp_path, "algo-3")
    config = settings.parse({"TRAINING_TOOLKIT_MAX_RESTARTS": "2", "TRAINING_TOOLKIT_GRACE_PERIOD": "5", **env})
    agent = HostAgent(ctx._replace(settings=config), script(), rejoining)
    agent.events.put(Verdict(0, None, "algo-1"))
    agent.run()
    assert seats[0].told[1] == ("barrier", 2) and seats[0].deadlines == [deadline]


def test_a_host_waiting_at_a_barrier_that_hears_the_job_succeed_ends_with_its_success_and_reports_nothing(tmp_path):
    seats: list[FakeSeat] = []
    ctx = context(tmp_path, "algo-3")
    config = settings.parse({"TRAINING_TOOLKIT_MAX_RESTARTS": "2", "TRAINING_TOOLKIT_MAX_HOSTS": "2"})
    agent = HostAgent(ctx._replace(settings=config), script(),
                      seat_factory(seats, fail_barrier=JobFailed("the job ended with code 0", 0)))
    assert agent.run() == Outcome(0)
    assert not [t for t in seats[0].told if isinstance(t, tuple) and t[0] == "failed"], seats[0].told


def test_what_a_runner_set_up_for_an_attempt_is_undone_when_it_ends_before_the_next_barrier(tmp_path):
    """``Seating.at_attempt_end``: the attempt's undo runs after its processes ended, before the next attempt's barrier
    (MPI: sshd admits nobody until the next go's keys), and the last attempt's at the job's end."""
    seats: list[FakeSeat] = []
    order: list = []

    def barriers(attempt: int) -> int:
        return seats[0].told.count(("barrier", attempt) if attempt else "barrier")

    def processes(seat):
        attempt = seat.attempt.number
        order.append(("start", attempt, barriers(attempt)))
        seat.at_attempt_end(lambda: order.append(("undo", attempt, barriers(attempt + 1))))
        return [Proc("script", (sys.executable, "-c", f"raise SystemExit({1 - attempt})"), {})]

    ctx = context(tmp_path, "algo-1")
    ctx = ctx._replace(settings=settings.parse({"TRAINING_TOOLKIT_MAX_RESTARTS": "1"}))
    outcome = HostAgent(ctx, RunnerSpec(processes), seat_factory(seats), hosts=("algo-1",)).run()
    assert outcome.exit_code == 0
    assert order == [("start", 0, 1), ("undo", 0, 0), ("start", 1, 1), ("undo", 1, 0)]


def test_a_parts_stop_is_dated_by_its_signal_not_by_its_end():
    """``PartStopped.at``: when the signal came, though the part took its save to stop (the root cause of a job
    stopped everywhere is the stop that came first, not the part that ended first)."""
    from queue import SimpleQueue

    from training_toolkit.agent.parts import Part

    events: SimpleQueue = SimpleQueue()
    saving = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n" \
             "print('ready', flush=True)\ntime.sleep(30)\n"
    child = Supervised([sys.executable, "-c", saving], dict(os.environ), stdout=subprocess.PIPE, relay_stderr=False)
    assert child.proc.stdout is not None and child.proc.stdout.readline() == b"ready\n"
    part = Part(events, RunnerSpec(lambda seat: []), grace_s=10)
    part.locals = [Local("script", child)]
    signalled = time.time()
    part.signal(signal.SIGTERM)
    stopped = events.get(timeout=10)
    ended = time.time()
    child.finish()
    assert stopped.signum == signal.SIGTERM and signalled <= stopped.at < signalled + 0.2 <= ended - 0.3
