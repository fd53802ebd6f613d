"""HostAgent: the template every runner follows on every host, the single one included (a job of one seat).

    join the channel -> prepare (e.g. sshd) -> barrier 0 -> start local processes
    -> monitor (local exits, peers, signals, progress) -> verdict -> stop and clean up
                 `-- a failure or a stall, restarts left: stop this host's part -> barrier n+1 -> start --'


Runners override the small steps (``prepare``, ``after_barrier``, ``start``,
``failure_of``, ``cleanup``); the order is here, once.  What each event means
and what every host is told is decided in ``decisions`` (a pure step, tested
without processes); this class is the shell around it: it turns exits, peers'
messages, signals and the passing of time into events, and carries out the
step's actions.  The first host decides the verdict and sends it to the
others; the others report their failures to it.  Nothing is left running:
every local process is stopped and reaped before ``run`` returns.

The seat in the job (``Membership``) comes from ``membership_factory``, so a
test can seat an agent in a fake job, and the single runner in a job of one
(``SoloSeat``: no channel, no port).

While stalls are watched (``TRAINING_TOOLKIT_STALL_TIMEOUT``), every process
the runner starts through ``supervise`` gets the heartbeat directory and the
faulthandler hook (``stacks``), and its output marks progress (``watch``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING

from training_toolkit import decisions
from training_toolkit.agent_watch import StallWatch
from training_toolkit.agent_events import (AnnounceRestart, GatherStacks, PartEnded, Phase, Rejoin, SendStacks,
                                           ShareProgress, StopPart)
from training_toolkit.cluster.membership import ChannelSettings, Membership, Seat
from training_toolkit.cluster.secret import job_secret
from training_toolkit.decisions import (PEER_FINISH_TIMEOUT_S, REPORT_WAIT_S, Announce, Finish, Forward, GotSignal,
                                        Interrupt, Joined, LocalExit, PartStopped, Report, ReportDone, SetupFailed, Started,
                                        Tick)
from training_toolkit.errors import ClusterError, CodeError, JobFailed, ToolkitError
from training_toolkit.log import log
from training_toolkit.records import record
from training_toolkit.process import FORWARDED_SIGNALS, STOPPING_SIGNALS, ExitStatus, SignalForwarder, Supervised, end_descendants
from training_toolkit.report import Outcome
from training_toolkit.runners.base import RunContext, outcome_of, with_hosts

if TYPE_CHECKING:  # the guard is imported where a runner names listeners to guard: a single host pays nothing for it
    from training_toolkit.cluster.guard import GuardSpec, ListenerGuard

FAILURE_GRACE_S = 2.0  # stopping local processes because the job failed elsewhere

# (secret, hosts, current host, channel settings, event queue, introduction) -> this host's seat
MembershipFactory = Callable[[bytes | None, Sequence[str], str, ChannelSettings, SimpleQueue,
                              Mapping[str, str] | None], Seat]


@record
class Local:
    """A process this host runs for the job; the host's part ends when its primaries end.

    ``rank``: the job-wide rank it is, for runners with one process per rank
    (its failure names it).  ``program``: it runs the user's command (a
    failure names the program) rather than a process of the toolkit's own
    (a failure names ``name``).
    """

    name: str
    child: Supervised
    primary: bool = True
    rank: int | None = None
    program: bool = True


class Stopped(ToolkitError):
    """A stopping signal arrived before the job started."""

    def __init__(self, signum: int):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before the job started")


class HostAgent(StallWatch):
    wait_for_peers = False  # on success, does the first host wait for every host's own success?
    own_end_on_stop = False  # stopped by a signal: is the script's own exit the verdict (a job of one seat)?

    def __init__(self, ctx: RunContext, membership_factory: MembershipFactory = Membership,
                 hosts: Sequence[str] | None = None):
        self.ctx = ctx
        self.host = ctx.plan.current_host
        self.hosts = tuple(hosts or ctx.plan.hosts)  # the job's hosts as this agent sees them
        self.is_master = self.hosts[0] == self.host
        self.secret = job_secret(ctx.settings)  # None: the platform gave none
        self.membership: Seat | None = None  # this host's seat, from run() on
        self._membership_factory = membership_factory
        self.events: SimpleQueue = SimpleQueue()
        self.settings = ChannelSettings.from_settings(ctx.settings, ctx.first_attempt)
        self.locals: list[Local] = []
        config = ctx.settings
        watch = decisions.Watch(config.stall_timeout_s, config.stall_startup_s) if config.stall_timeout_s else None
        stop_wait_s = decisions.stop_wait(ctx.grace_s)
        self.state = (decisions.first_host(self.host, self.hosts[1:], self.wait_for_peers, config.max_restarts, watch,
                                           self.own_end_on_stop, ctx.first_attempt, stop_wait_s) if self.is_master
                      else decisions.other_host(self.host, config.max_restarts, ctx.first_attempt, stop_wait_s))
        self.watch_dir = None
        self._progress = None

    @property
    def attempt(self) -> int:
        return self.state.attempt

    # Steps for runners to override ------------------------------------------------------------

    def introduction(self) -> dict[str, str]:
        """What this host tells the others when it joins (e.g. its ssh host key); public facts only."""
        return {}

    def prepare(self) -> None:
        """After joining, before this host says it is ready (every host)."""

    def after_barrier(self) -> None:
        """After every host is ready, before anything starts (first host only)."""

    def start(self) -> list[Local]:
        """The processes this host runs for the job (may be none)."""
        return []

    def judged(self, local: Local, status: ExitStatus) -> ExitStatus:
        """How a local process ended, as the job sees it: its exit status, unless the runner knows better."""
        return status

    def failure_of(self, local: Local, status: ExitStatus) -> Outcome:
        """The outcome of a local process that failed, its reason naming this host."""
        if local.rank is not None:
            return outcome_of(local.child, status, label=f"{self.host} rank {local.rank}")
        return outcome_of(local.child, status, label=self.host, what=None if local.program else local.name)

    def cleanup(self) -> None:
        """After every local process is gone (every host, always)."""

    def stop_part(self) -> None:
        """Stop this host's part of the attempt for a restart (grace period, then kill); return once it is gone."""
        self._stop_locals(self.ctx.grace_s)

    def prepare_attempt(self) -> None:
        """Before a restart's barrier: what this host's next attempt needs ready (e.g. MPI's rank file)."""

    def after_restart_barrier(self) -> None:
        """After a restart's barrier, before anything starts (first host only): e.g. a rejoined host's new ssh key."""

    def guard_spec(self) -> GuardSpec | None:
        """The listeners of this runner's processes that only the job's hosts may reach (cluster/guard.py)."""
        return None

    def signal_job(self, signum: int) -> None:
        """Pass a signal ``train`` received to this host's part of the job.

        By default every local process gets it (stopping signals with the grace
        period, then SIGKILL), and ``PartStopped`` is posted once all of them
        are gone: the job hears of this host's stop when its whole part has
        stopped, not when its first process ends.  A runner whose processes are
        not its children (MPI ranks under sshd) posts ``PartStopped`` itself.
        """
        self._forward(signum, self.ctx.grace_s)
        if signum in STOPPING_SIGNALS and not self.own_end_on_stop:
            _in_thread(self._part_stopped, "part-stopped", signum, list(self.locals))

    def _part_stopped(self, signum: int, locals_: list[Local]) -> None:
        for local in locals_:
            local.child.wait()  # each has its grace, and SIGKILL after it (Supervised.stop)
        self.events.put(PartStopped(signum, time.time()))

    # The template -----------------------------------------------------------------------------

    def run(self) -> Outcome:
        if self.secret is None and self.is_master and len(self.hosts) > 1:
            log("no job secret from the platform: hosts are admitted by address and every key is random "
                "(docs/security.md)")
        try:  # a host that cannot take part joins all the same, to tell the job why
            introduction, unusable = ({}, self.ctx.setup_error) if self.ctx.setup_error else (self.introduction(), None)
        except ToolkitError as exc:
            introduction, unusable = {}, exc
        membership = self.membership = self._membership_factory(self.secret, self.hosts, self.host,
                                                                self.settings, self.events, introduction)
        guard: ListenerGuard | None = None
        try:
            with SignalForwarder(self._on_signal):
                try:
                    membership.open()
                    with _signals_held():
                        self._step(Joined(*membership.job_attempt))
                    if unusable is not None:
                        raise unusable
                    self._take_hosts(membership.hosts)
                    self._start_watch()
                    self.prepare()
                    membership.barrier(self.attempt, self._barrier_deadline())
                    if self.is_master:
                        self.after_barrier()
                    spec = self.guard_spec()
                    if spec is not None:  # imported only here: a single host never loads it (docs/benchmarks.md)
                        from training_toolkit.cluster.guard import start_guard

                        guard = start_guard(spec, self.ctx.plan.hosts)  # before the processes start
                    self._say_attempt(self._why_this_attempt())
                    self.locals = self.start()
                except ToolkitError as exc:
                    return self._failed_before_start(exc)
                except OSError as exc:  # a program that cannot be started (missing, not executable)
                    return self._failed_before_start(_cannot_start(exc))
                outcome = self._started()
                while outcome is None:
                    outcome = self._carry_out(self._step(self._next_event()))
        finally:
            self._stop_locals(FAILURE_GRACE_S)
            if guard is not None:
                guard.stop()
            self.cleanup()
            membership.close()
            ended = end_descendants()
            if ended:
                log(f"ended processes the job left behind: {', '.join(ended)}")
            self._end_watch()
        return outcome

    def _take_hosts(self, hosts: Sequence[str]) -> None:
        """A host other than the first takes the job's hosts from the first host's welcome, never from its own view."""
        hosts = tuple(hosts)
        if self.is_master or hosts == self.ctx.plan.hosts:
            return
        log(f"{self.host}: host of {', '.join(hosts)} (from the first host)")
        self.ctx = with_hosts(self.ctx, hosts)
        self.hosts = hosts

    def _started(self) -> Outcome | None:
        if self._progress is not None:
            self._progress.attempt = self.attempt
        for local in self.locals:
            _watch(local, self.events, self.attempt)
        with _signals_held():  # the handler steps too while setting up: never both at once
            actions = self._step(Started(tuple(local.name for local in self.locals if local.primary)))
        return self._carry_out(actions)

    def _barrier_deadline(self) -> float | None:
        """A host that rejoins waits for the restart its loss caused: the first host stops its part first (grace)."""
        return self.settings.join_timeout_s + self.ctx.grace_s if self.attempt > self.state.first_attempt else None

    def _why_this_attempt(self) -> str:
        """Why the first attempt of this ``train`` is not 0: it rejoined a job that went on, or the platform restarted it."""
        if self.attempt > self.state.first_attempt:
            return "rejoining the job"
        return "the platform restarted the job" if self.attempt else ""

    def _say_attempt(self, reason: str) -> None:
        """One line per attempt, when restarts are on: which, of how many, and why."""
        total = self.state.first_attempt + self.ctx.settings.max_restarts + 1
        if total > 1:
            log(f"{self.host}: attempt {self.attempt + 1} of {total} starting" + (f" ({reason})" if reason else ""))

    # The shell --------------------------------------------------------------------------------

    def _step(self, event: decisions.Event) -> tuple[decisions.Action, ...]:
        self.state, actions = decisions.step(self.state, event, time.monotonic())
        return actions

    def _next_event(self) -> decisions.Event:
        deadline = decisions.next_deadline(self.state)
        try:
            event = self.events.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except Empty:
            return Tick()
        if isinstance(event, LocalExit) and event.attempt == self.attempt:
            local = next(local for local in self.locals if local.name == event.name)  # the runner says what failed
            status = self.judged(local, event.status)
            if not status.ok:
                event = LocalExit(event.name, status, event.at, self.failure_of(local, status), event.attempt)
        return event

    def _carry_out(self, actions: tuple[decisions.Action, ...]) -> Outcome | None:
        """Do what the step said; the outcome once it says this host is done."""
        assert self.membership is not None
        for action in actions:
            if isinstance(action, Forward):
                self.signal_job(action.signum)
            elif isinstance(action, Announce):
                self.membership.announce(action.verdict)
            elif isinstance(action, Report):
                self.membership.report_failure(action.reason, action.exit_code, action.at, action.attempt,
                                               action.stopped)
            elif isinstance(action, ShareProgress):
                self.membership.progress(action.heartbeat)
            elif isinstance(action, GatherStacks):
                _in_thread(self._gather_stacks, "gather-stacks")
            elif isinstance(action, SendStacks):
                _in_thread(self._send_stacks, "send-stacks")
            elif isinstance(action, AnnounceRestart):
                self.membership.restart(action.attempt, action.reason)
            elif isinstance(action, StopPart):
                _in_thread(self._stop_part, "stop-part", action.attempt)
            elif isinstance(action, Rejoin):
                return self._rejoin(action)
            elif isinstance(action, ReportDone):
                self.membership.report_done(action.exit_code)
            elif isinstance(action, Interrupt):
                raise Stopped(action.signum)
            elif isinstance(action, Finish):
                return action.outcome
        return None

    def _stop_part(self, attempt: int) -> None:
        self.stop_part()
        self.events.put(PartEnded(attempt))

    def _rejoin(self, action: Rejoin) -> Outcome | None:
        """Meet every host at the barrier of the new attempt and start this host's part again."""
        assert self.membership is not None
        try:
            self._say_attempt(action.reason)
            self.locals = []
            self.prepare_attempt()
            # a host may still be giving its ranks their grace period: that is not a host that did not come back
            self.membership.barrier(action.attempt, self.settings.join_timeout_s + self.ctx.grace_s)
            if self.is_master:
                self.after_restart_barrier()
            self.locals = self.start()
        except ToolkitError as exc:
            return self._failed_before_start(exc)
        except OSError as exc:
            return self._failed_before_start(_cannot_start(exc))
        return self._started()

    def _on_signal(self, signum: int) -> None:
        if self.state.phase not in (Phase.SETUP, Phase.BARRIER):
            self.events.put(GotSignal(signum))
            return
        self._carry_out(self._step(GotSignal(signum)))  # Interrupt raises Stopped into the setup step

    def setup_failure(self, exc: ToolkitError) -> str:
        """A setup failure's reason, naming this host (a job of one host names none, as the reference)."""
        return str(exc) if isinstance(exc, JobFailed) else named(self.host, exc)

    def _failed_before_start(self, exc: ToolkitError) -> Outcome:
        reason = self.setup_failure(exc)
        with _signals_held():
            actions = self._step(SetupFailed(Outcome(exc.exit_code, reason), time.time()))
        outcome = self._carry_out(actions)
        assert outcome is not None
        return outcome

    def _forward(self, signum: int, grace_s: float) -> None:
        for local in self.locals:
            if signum in STOPPING_SIGNALS:
                local.child.stop(signum, grace_s)
            else:
                local.child.send(signum)

    def _stop_locals(self, grace_s: float) -> None:
        for local in self.locals:
            if local.child.poll() is None:
                local.child.stop(signal.SIGTERM, grace_s)
        for local in self.locals:
            local.child.wait(grace_s + 5)
            local.child.finish(linger_s=1.0)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Signals wait (at the OS) until the block ends: their handler never runs in the middle of it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def named(host: str, error: Exception) -> str:
    """An error's message as a job-wide reason: it starts with the host it happened on."""
    text = str(error)
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


def _watch(local: Local, events: SimpleQueue, attempt: int) -> None:
    def wait() -> None:
        status = local.child.wait()
        events.put(LocalExit(local.name, status, time.time(), attempt=attempt))

    threading.Thread(target=wait, name=f"watch-{local.name}", daemon=True).start()


def _in_thread(target: Callable, name: str, *args) -> None:
    threading.Thread(target=target, args=args, name=name, daemon=True).start()


def _cannot_start(exc: OSError) -> CodeError:
    return CodeError(f"cannot start {exc.filename or 'a process'}: {exc.strerror or exc}")


__all__ = ["HostAgent", "Local", "LocalExit", "GotSignal", "PartStopped", "Stopped", "ClusterError", "log",
           "PEER_FINISH_TIMEOUT_S", "REPORT_WAIT_S", "named"]
