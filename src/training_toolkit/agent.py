"""The agent: the one shell every runner runs in on every host, the single one included (a job of one seat).

    join the channel -> the runner's hold (e.g. sshd) -> barrier 0 -> start the attempt's processes
    -> monitor (local exits, peers, signals, progress) -> verdict -> stop and clean up
                 `-- a failure or a stall, restarts left: stop this host's part -> barrier n+1 -> start --'

A runner is a value (``runspec.RunnerSpec``), not a subclass: the processes of
each attempt, what it holds for the job, the listeners the guard covers, how
its exits are judged, and its few hooks.  The order is here, once; what each
event means and what every host is told is decided in ``decisions`` (a pure
step, tested without processes); the agent is the shell around it: it turns
exits, peers' messages, signals and the passing of time into events, and
carries out the step's actions.  The first host decides the verdict and sends
it to the others; the others report their failures to it.

What the job holds is on one ``ExitStack`` (``run``): the stall watch, the
leftover scan, the seat, the runner's hold, the guard, and the attempt's own
stack (its processes), left in that order reversed.  Nothing is left running:
every local process is stopped and reaped before ``run`` returns.

The seat in the job (``Membership``) comes from ``membership_factory``, so a
test can seat an agent in a fake job; a job of one (``spec.solo``) sits in a
``SoloSeat`` (no channel, no port).  While stalls are watched
(``TRAINING_TOOLKIT_STALL_TIMEOUT``), every process gets the heartbeat directory
and the faulthandler hook (``agent_watch``), and its output marks progress.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from queue import Empty, SimpleQueue

from training_toolkit import decisions, roster
from training_toolkit.agent_watch import StallWatch
from training_toolkit.agent_events import (AnnounceRestart, GatherStacks, PartEnded, Phase, Rejoin, SendStacks,
                                           ShareProgress, StopPart)
from training_toolkit.cluster.membership import ChannelSettings, Membership, Seat, SoloSeat
from training_toolkit.cluster.secret import job_secret
from training_toolkit.decisions import (Announce, Finish, Forward, GotSignal, Interrupt, Joined, LocalExit, PartStopped,
                                        Report, ReportDone, Say, SetupFailed, Started, Tick)
from training_toolkit.errors import ClusterError, CodeError, ConfigError, JobFailed, ToolkitError
from training_toolkit.log import log
from training_toolkit.process import FORWARDED_SIGNALS, STOPPING_SIGNALS, ExitStatus, SignalForwarder, end_descendants
from training_toolkit.report import Outcome
from training_toolkit.runspec import Local, Proc, RunContext, RunnerSpec, Seating, with_hosts, write_resource_config
from training_toolkit.runspec import failure_of as described_failure

FAILURE_GRACE_S = 2.0  # stopping local processes because the job failed elsewhere

# (secret, hosts, current host, channel settings, event queue, introduction) -> this host's seat
MembershipFactory = Callable[[bytes | None, Sequence[str], str, ChannelSettings, SimpleQueue,
                              Mapping[str, str] | None], Seat]


def run(ctx: RunContext, spec: RunnerSpec) -> Outcome:
    """Run this host's part of the job, as ``spec`` says, to the job's verdict."""
    return HostAgent(ctx, spec).run()


class Stopped(ToolkitError):
    """A stopping signal arrived before the job started."""

    def __init__(self, signum: int):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before the job started")


class HostAgent(StallWatch):
    def __init__(self, ctx: RunContext, spec: RunnerSpec, membership_factory: MembershipFactory | None = None,
                 hosts: Sequence[str] | None = None):
        self.ctx = ctx
        self.spec = spec
        self.host = ctx.plan.current_host
        self.hosts = tuple(hosts or ((self.host,) if spec.solo else ctx.plan.hosts))  # the job's hosts as seen here
        self.is_master = self.hosts[0] == self.host
        self.secret = job_secret(ctx.settings)  # None: the platform gave none
        self.membership: Seat | None = None  # this host's seat, from run() on
        self._membership_factory = membership_factory or (SoloSeat if spec.solo else Membership)
        self.events: SimpleQueue = SimpleQueue()
        self.settings = ChannelSettings.from_settings(ctx.settings, ctx.first_attempt)
        self.locals: list[Local] = []
        self._attempt = ExitStack()  # this attempt's processes: stopped when it ends
        self._stopping = False  # a runner's own stop (``spec.stop``) has begun
        config = ctx.settings
        watch = decisions.Watch(config.stall_timeout_s, config.stall_startup_s) if config.stall_timeout_s else None
        stop_wait_s = decisions.stop_wait(ctx.grace_s)
        self.state = (decisions.first_host(self.host, self.hosts[1:], spec.wait_for_peers, config.max_restarts, watch,
                                           spec.own_end_on_stop, ctx.first_attempt, stop_wait_s) if self.is_master
                      else decisions.other_host(self.host, config.max_restarts, ctx.first_attempt, stop_wait_s))
        self.watch_dir = None
        self._progress = None
        # who takes part (roster.py): the first host chooses each attempt's active hosts, every host takes them
        self.attempt_ctx = ctx  # this attempt's view of the job: its active hosts only (``with_hosts``)
        self.active: tuple[str, ...] = self.hosts
        self.roster = roster.Roster(self.hosts)
        self.max_hosts, self.min_hosts = len(self.hosts), len(self.hosts)
        self.elastic = False  # spares, or a minimum below the maximum: a lost host need not end the job
        self._turn: roster.Turn | None = None  # the first host's last choice, for the attempt's line

    @property
    def attempt(self) -> int:
        return self.state.attempt

    def seating(self, attempt: bool = False) -> Seating:
        """The attempt's membership as the runner's hooks see it, now.

        ``attempt``: the job as this attempt runs it (its active hosts, ranks renumbered), for its processes;
        else the job's every host (what the runner holds, the guard: a spare may be seated later).
        """
        seat = self.membership
        return Seating(self.attempt_ctx if attempt else self.ctx, self.attempt, self.is_master, seat.job_id if seat else "",
                       seat.introductions if seat else {}, self.job_env, self.settings.join_timeout_s)

    # The template -----------------------------------------------------------------------------

    def run(self) -> Outcome:
        spec = self.spec
        if self.secret is None and self.is_master and len(self.hosts) > 1:
            log("no job secret from the platform: hosts are admitted by address and every key is random "
                "(docs/security.md)")
        try:  # a host that cannot take part joins all the same, to tell the job why
            introduction, unusable = (({}, self.ctx.setup_error) if self.ctx.setup_error else
                                      (dict(spec.introduction()) if spec.introduction else {}, None))
        except ToolkitError as exc:
            introduction, unusable = {}, exc
        membership = self.membership = self._membership_factory(self.secret, self.hosts, self.host,
                                                                self.settings, self.events, introduction)
        with ExitStack() as job:  # left in reverse: the attempt's processes, the guard, the hold, the seat, ...
            job.callback(self._end_watch)
            job.callback(_end_leftovers)
            job.callback(membership.close)
            with SignalForwarder(self._on_signal):
                try:
                    membership.open()
                    with _signals_held():
                        self._step(Joined(*membership.job_attempt))
                    if unusable is not None:
                        raise unusable
                    self._take_hosts(membership.hosts)
                    self._take_limits()
                    self._start_watch()
                    if spec.hold is not None:
                        job.enter_context(spec.hold(self.seating()))
                    if spec.prepare is not None:
                        spec.prepare(self.seating())
                    self._seat(membership.barrier(self.attempt, self._barrier_deadline(),
                                                  choose=self._first_choice if self.is_master else None))
                    if self.is_master and spec.after_barrier is not None:
                        spec.after_barrier(self.seating())
                    guarded = spec.guard(self.seating()) if callable(spec.guard) else spec.guard
                    if guarded is not None:  # imported only here: a job of one seat never loads it
                        from training_toolkit.cluster.guard import start_guard

                        guard = start_guard(guarded, self.ctx.plan.hosts)  # every host of the job: a spare may be seated
                        if guard is not None:
                            job.callback(guard.stop)
                    job.callback(lambda: self._attempt.close())  # whichever attempt is the last
                    if self.host in self.active:  # a spare said it waits
                        self._say_attempt(self._why_this_attempt())
                    self._start()
                except ToolkitError as exc:
                    return self._failed_before_start(exc)
                except OSError as exc:  # a program that cannot be started (missing, not executable)
                    return self._failed_before_start(self._cannot_start(exc))
                outcome = self._started()
                while outcome is None:
                    outcome = self._carry_out(self._step(self._next_event()))
        return outcome

    def _start(self) -> None:
        """Start the attempt's processes, each on this attempt's stack (stopped with the failure grace at the end).

        A spare (not among the attempt's active hosts) starts none: it stays joined, and waits.
        """
        procs = self.spec.processes(self.seating(attempt=True)) if self.host in self.active else ()
        self.locals = started = []
        self._attempt.callback(_stop_locals, started, FAILURE_GRACE_S)
        for proc in procs:
            child = self.supervise(proc.argv, proc.env, cwd=proc.cwd)
            started.append(Local(proc.name, child, proc.primary, proc.rank, proc.program))

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
            actions = self._step(Started(tuple(local.name for local in self.locals if local.primary), self.active))
        return self._carry_out(actions)

    # Who takes part ---------------------------------------------------------------------------

    def _take_limits(self) -> None:
        """The job's maximum and minimum of active hosts, checked on every host against the job's hosts (the first
        host's list, taken already) before anything starts: a ConfigError, exit 78, that the first host announces."""
        config = self.ctx.settings
        if self.spec.solo or (config.max_hosts is None and config.min_hosts is None):
            return
        try:
            self.max_hosts, self.min_hosts = roster.limits(len(self.hosts), config.max_hosts, config.min_hosts)
        except ValueError as exc:
            raise ConfigError("settings", None, f"{exc}: the job's hosts are {', '.join(self.hosts)}") from None
        self.elastic = roster.elastic(len(self.hosts), self.max_hosts, self.min_hosts)
        if self.elastic and not self.spec.follows_active_hosts:
            raise ConfigError("settings", None, f"TRAINING_TOOLKIT_MAX_HOSTS and TRAINING_TOOLKIT_MIN_HOSTS are not "
                              f"supported by the {self.ctx.plan.runner} runner yet (its processes do not follow an "
                              f"attempt's hosts): unset them")
        if self.elastic and self.ctx.job.resource.instance_groups:
            raise ConfigError("settings", None, "TRAINING_TOOLKIT_MAX_HOSTS and TRAINING_TOOLKIT_MIN_HOSTS need a "
                              "job without instance groups (a group names its hosts)")
        self.roster = roster.first_roster(self.hosts, self.max_hosts)

    def _first_choice(self, alive: frozenset, why: Mapping[str, str]) -> tuple[str, ...]:
        """Barrier 0: the first roster (every host joined and ready)."""
        self._turn = roster.Turn(self.roster)
        return self.roster.active

    def _next_choice(self, alive: frozenset, why: Mapping[str, str]) -> tuple[str, ...]:
        """A restart's barrier: the next roster from the hosts alive and ready; too few ends the job, named."""
        last = self.roster
        for host in self.hosts:  # a host that left and came back waits as a spare
            if host in alive and host not in (*last.active, *last.spares, *last.retired):
                last = roster.joined(last, host)
        retire = roster.to_retire(self.state.cause_hosts) if self.elastic else frozenset()
        turn = roster.next_roster(last, alive, max_hosts=self.max_hosts, min_hosts=self.min_hosts, retire=retire,
                                  why=why)
        if isinstance(turn, roster.Shortfall):
            raise ClusterError(turn.reason())
        self.roster, self._turn = turn.roster, turn
        return turn.roster.active

    def _seat(self, active: Sequence[str] | None) -> None:
        """Take the attempt's active hosts: an active host's processes see only them; a spare waits."""
        active = tuple(active or self.hosts)
        was_spare = self.host not in self.active
        self.active = active
        if self.is_master and self.elastic and self._turn is not None:
            total = self.state.first_attempt + self.ctx.settings.max_restarts + 1
            log(f"{self.host}: {roster.attempt_line(self.attempt + 1, total, self._turn)}")
        if self.host not in active:
            if not was_spare:  # once, when it starts waiting (at the first attempt, or retired)
                log(f"{self.host}: a spare: waiting (attempt {self.attempt + 1} runs on {', '.join(active)})")
            return
        if was_spare:
            log(f"{self.host}: seated in attempt {self.attempt + 1} (rank order: {', '.join(active)})")
        if active == self.hosts:  # every host of the job (a job of one seat: its own)
            if self.attempt_ctx is not self.ctx:  # back to every host: the resource config says so again
                write_resource_config(self.ctx.job)
            self.attempt_ctx = self.ctx
        else:
            self.attempt_ctx = with_hosts(self.ctx, active)

    def _barrier_deadline(self) -> float | None:
        """A host that rejoins waits for the restart its loss caused: the first host stops its part first (grace).

        In a job with spares or a minimum it is a spare until a restart seats it: it waits for the next barrier
        or the verdict, however long the job runs (the first host's loss still ends the wait).
        """
        if self.attempt <= self.state.first_attempt:
            return None
        return float("inf") if self.elastic else self.settings.join_timeout_s + self.ctx.grace_s

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
            status = self.spec.judge(local, event.status) if self.spec.judge else event.status
            if not status.ok:
                event = LocalExit(event.name, status, event.at, self.failure_of(local, status), event.attempt)
        return event

    def failure_of(self, local: Local, status: ExitStatus) -> Outcome:
        """The outcome of a local process that failed, as the runner describes it, else naming this host."""
        if self.spec.failure is not None:
            return self.spec.failure(local, status)
        return described_failure(local, status, None if self.spec.solo else self.host)

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
                _in_thread(self._stop_part, "stop-part", action.attempt, list(self.locals))
            elif isinstance(action, Say):
                log(action.line)
            elif isinstance(action, Rejoin):
                return self._rejoin(action)
            elif isinstance(action, ReportDone):
                self.membership.report_done(action.exit_code)
            elif isinstance(action, Interrupt):
                raise Stopped(action.signum)
            elif isinstance(action, Finish):
                return action.outcome
        return None

    def signal_job(self, signum: int) -> None:
        """Pass a signal ``train`` received to this host's part of the job.

        By default every local process gets it (stopping signals with the grace
        period, then SIGKILL), and ``PartStopped`` is posted once all of them
        are gone: the job hears of this host's stop when its whole part has
        stopped, not when its first process ends.  A runner with its own stop
        (``spec.stop``: MPI's ranks are not our children) is asked once, and
        ``PartStopped`` is posted when it returns.
        """
        if signum in STOPPING_SIGNALS and self.spec.stop is not None:
            if not self._stopping:
                self._stopping = True
                _in_thread(self._runner_stop, "stop-ranks", signum, list(self.locals))
            return
        _forward(self.locals, signum, self.ctx.grace_s)
        if signum in STOPPING_SIGNALS and not self.spec.own_end_on_stop:
            _in_thread(self._part_stopped, "part-stopped", signum, list(self.locals))

    def _runner_stop(self, signum: int, locals_: list[Local]) -> None:
        assert self.spec.stop is not None
        self.spec.stop(signum, locals_)
        self.events.put(PartStopped(signum, time.time()))  # a stopped job did not complete, whatever its ranks returned

    def _part_stopped(self, signum: int, locals_: list[Local]) -> None:
        for local in locals_:
            local.child.wait()  # each has its grace, and SIGKILL after it (Supervised.stop)
        self.events.put(PartStopped(signum, time.time()))

    def _stop_part(self, attempt: int, locals_: list[Local]) -> None:
        """For a restart: stop this host's part of the attempt (the grace period, then kill); PartEnded once it is gone."""
        if self.spec.stop_for_restart is not None:
            self.spec.stop_for_restart(locals_)
        _stop_locals(locals_, self.ctx.grace_s)
        self.events.put(PartEnded(attempt))

    def _rejoin(self, action: Rejoin) -> Outcome | None:
        """Meet every host at the barrier of the new attempt and start this host's part again."""
        assert self.membership is not None
        try:
            self._say_attempt(action.reason)
            self._attempt.pop_all()  # the last attempt's processes are gone (StopPart)
            self.locals = []
            if self.spec.before_restart is not None:
                self.spec.before_restart(self.seating())
            # a host may still be giving its ranks their grace period: that is not a host that did not come back
            self._seat(self.membership.barrier(action.attempt, self.settings.join_timeout_s + self.ctx.grace_s,
                                               choose=self._next_choice if self.is_master else None,
                                               alive_only=self.elastic))
            if self.is_master and self.spec.after_restart_barrier is not None:
                self.spec.after_restart_barrier(self.seating())
            self._start()
        except ToolkitError as exc:
            return self._failed_before_start(exc)
        except OSError as exc:
            return self._failed_before_start(self._cannot_start(exc))
        return self._started()

    def _on_signal(self, signum: int) -> None:
        if self.state.phase not in (Phase.SETUP, Phase.BARRIER):
            self.events.put(GotSignal(signum))
            return
        self._carry_out(self._step(GotSignal(signum)))  # Interrupt raises Stopped into the setup step

    def setup_failure(self, exc: ToolkitError) -> str:
        """A setup failure's reason, naming this host (a job of one seat names none, as the reference)."""
        return str(exc) if isinstance(exc, JobFailed) or self.spec.solo else named(self.host, exc)

    def _cannot_start(self, exc: OSError) -> CodeError:
        if self.spec.solo:  # the user's script, as the reference says it
            return CodeError(f"cannot run {self.ctx.argv[0]}: {exc.strerror or exc}")
        return CodeError(f"cannot start {exc.filename or 'a process'}: {exc.strerror or exc}")

    def _failed_before_start(self, exc: ToolkitError) -> Outcome:
        if isinstance(exc, JobFailed) and exc.exit_code == 0:  # a spare waiting at a barrier heard the job succeed
            return Outcome(0)
        reason = self.setup_failure(exc)
        with _signals_held():
            actions = self._step(SetupFailed(Outcome(exc.exit_code, reason), time.time()))
        outcome = self._carry_out(actions)
        assert outcome is not None
        return outcome


def _forward(locals_: Sequence[Local], signum: int, grace_s: float) -> None:
    for local in locals_:
        if signum in STOPPING_SIGNALS:
            local.child.stop(signum, grace_s)
        else:
            local.child.send(signum)


def _stop_locals(locals_: Sequence[Local], grace_s: float) -> None:
    for local in locals_:
        if local.child.poll() is None:
            local.child.stop(signal.SIGTERM, grace_s)
    for local in locals_:
        local.child.wait(grace_s + 5)
        local.child.finish(linger_s=1.0)


def _end_leftovers() -> None:
    ended = end_descendants()
    if ended:
        log(f"ended processes the job left behind: {', '.join(ended)}")


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


__all__ = ["HostAgent", "Local", "Proc", "RunnerSpec", "Stopped", "named", "run"]
