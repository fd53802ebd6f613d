"""The agent's loop: the one shell every runner runs in on every host, the single one included (a job of one seat).

    join the channel -> what the runner prepares (e.g. sshd) -> barrier 0 -> start the attempt's processes
    -> monitor (local exits, peers, signals, progress) -> verdict -> stop and clean up
                 `-- a failure or a stall, restarts left: stop this host's part -> barrier n+1 -> start --'

A runner is a value (``runspec.RunnerSpec``), not a subclass.  The order is here, once; what each event means and
what every host is told is decided in ``decisions`` (a pure step, tested without processes); the loop turns exits,
peers' messages (the channel's server only posts them), signals and the passing of time (``Tick``) into events, and
carries out the step's actions (``actions``).  The lead's barrier is one more run of the loop (``meeting.barrier``):
the step says when every host is ready (``Release``) or why not; a follower whose lead was lost meets the next lead
there (``meeting.next_lead``).

What the job holds is on one ``ExitStack`` (``run_job``): the stall watch, the leftover scan, the seat, what the
runner prepared, the guard, and the attempt's own stack (its processes), left in that order reversed.  Nothing is
left running.  The seat (``Membership``) comes from ``membership_factory`` (a test's fake); a job of one
(``spec.solo``) sits in a ``SoloSeat``, importing no membership code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING

from training_toolkit.agent import actions as carry, decisions, meeting
from training_toolkit.agent.actions import Ended, Stopped
from training_toolkit.agent.events import GotSignal, Joined, LocalExit, Phase, SetupFailed, Started, Tick
from training_toolkit.agent.parts import Part, end_leftovers, signals_held, stop_locals
from training_toolkit.agent.recording import Recorder
from training_toolkit.agent.seats import Seats, SoloSeat, why_this_attempt
from training_toolkit.agent.stall import StallWatch
from training_toolkit.cluster.events import PeerLost
from training_toolkit.job.attempt import Attempt
from training_toolkit.core.errors import JobFailed, ToolkitError
from training_toolkit.core.log import log
from training_toolkit.supervise.process import STOPPING_SIGNALS, ExitStatus, SignalForwarder, Supervised
from training_toolkit.job.report import Outcome
from training_toolkit.runspec import Blamed, failure_of as described_failure, Local, RunContext, RunnerSpec, Seating

if TYPE_CHECKING:
    from training_toolkit.cluster.seat import Seat
    from training_toolkit.cluster.timing import ChannelSettings

FAILURE_GRACE_S = 2.0  # stopping local processes because the job failed elsewhere

# (secret, hosts, current host, channel settings, event queue, introduction, looking=False) -> this host's seat
MembershipFactory = Callable[..., "Seat"]  # solo: no channel; ``looking``: it joins a running job or none


def run(ctx: RunContext, spec: RunnerSpec) -> Outcome:
    """Run this host's part of the job, as ``spec`` says, to the job's verdict."""
    return HostAgent(ctx, spec).run()


def _seat_of(spec: RunnerSpec) -> MembershipFactory:
    if spec.solo:
        return SoloSeat
    from training_toolkit.cluster.membership import Membership  # a job of one seat imports no membership code

    return Membership


class HostAgent:
    def __init__(self, ctx: RunContext, spec: RunnerSpec, membership_factory: MembershipFactory | None = None,
                 hosts: Sequence[str] | None = None, recorder: Recorder | None = None):
        self.spec = spec
        host = ctx.plan.current_host
        self.seats = Seats(ctx, tuple(hosts or ((host,) if spec.solo else ctx.plan.hosts)), ctx.first_attempt)
        self.host, self.is_lead = host, self.seats.is_lead
        self.membership: Seat | None = None  # this host's seat, from run() on
        # the platform's secret (None: it gave none, and none is made up: hosts are admitted by address, every key is
        # random, docs/security.md) and the channel's port and clocks: a job of one seat has neither
        self.secret: bytes | None = None
        self.settings: ChannelSettings | None = None
        if not spec.solo:  # imported only here: a job of one seat loads no channel code
            from training_toolkit.cluster.timing import ChannelSettings

            self.secret, self.settings = ctx.settings.job_secret, ChannelSettings.from_settings(ctx.settings, ctx.first_attempt)
        self._membership_factory = membership_factory or _seat_of(spec)
        self.events: SimpleQueue = SimpleQueue()
        self.part = Part(self.events, spec, ctx.grace_s)
        self._attempt = ExitStack()  # this attempt's processes, and what the runner set up for it: ended with it
        self.in_barrier = False  # the lead's barrier runs the loop: it reads the signal's event there
        self._stop_signum: int | None = None  # a stopping signal during setup, stepped at the next safe point
        config = ctx.settings
        self.stall = StallWatch(self.events, config.stall_timeout_s, config.py_spy, ctx.environ,
                                progress=not spec.solo)  # for the record: every job with hosts to lose
        self.recorder = recorder or Recorder(ctx.job.paths.output_data_dir, host, config.stall_timeout_s, config.stall_startup_s)
        self.watch = watch = (decisions.Watch(config.stall_timeout_s, config.stall_startup_s)
                               if config.stall_timeout_s else None)
        stop_s = decisions.stop_wait(ctx.grace_s)
        self.state = (decisions.lead_state(host, self.hosts[1:], spec.wait_for_peers, config.max_restarts, watch,
                                           spec.solo, ctx.first_attempt, stop_s) if self.is_lead
                      else decisions.follower_state(host, config.max_restarts, ctx.first_attempt, stop_s))

    ctx = property(lambda self: self.seats.ctx)
    hosts = property(lambda self: self.seats.hosts)
    active = property(lambda self: self.seats.active)
    elastic = property(lambda self: self.seats.elastic)
    locals = property(lambda self: self.part.locals)
    attempt = property(lambda self: self.state.attempt)

    def seating(self, attempt: bool = False) -> Seating:
        """The attempt's membership as the runner's hooks see it, now.  ``attempt``: the job as this attempt runs it
        (its active hosts, ranks renumbered); else every host of the job (what the runner holds, the guard)."""
        seat = self.membership
        return Seating(self.seats.attempt_ctx if attempt else self.ctx, self.seats.attempt,
                       seat.job_id if seat else "", seat.introductions if seat else {}, self.job_env,
                       self.ctx.settings.join_timeout_s, self._attempt.callback if attempt else None)

    def supervise(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None, **kw) -> Supervised:
        """Start one process of the job: with the attempt, and the stall watch's hook and output relay if on."""
        return Supervised(argv, self.job_env(env), cwd=cwd, on_output=self.stall.on_output(self.attempt), **kw)

    def job_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with what ``supervise`` adds, for a runner whose ranks are not its children (mpirun's: ``Seating``)."""
        return self.stall.process_env(env, self.attempt)

    def new_seat(self, introduction: Mapping[str, str], **looking: bool) -> Seat:
        """This host's seat in the job, made (``looking=True``: one that joins a running job or none)."""
        return self._membership_factory(self.secret, self.hosts, self.host, self.settings, self.events, introduction, **looking)

    def introduction(self) -> dict[str, str]:
        """What this host tells the others about itself, as its runner has it now (``RunnerSpec.introduction``)."""
        return dict(self.spec.introduction()) if self.spec.introduction else {}

    # The template (below: the shell) ------------------------------------------------------------
    def run(self) -> Outcome:
        """This host's part of the job to its verdict (out of it with no majority, it looks for it first: ``meeting``)."""
        if self.secret is None and self.is_lead and len(self.hosts) > 1:
            log("no job secret from the platform: hosts are admitted by address and every key is random "
                "(docs/security.md)")
        outcome = meeting.back_into_the_job(self, self.run_job(), lambda: HostAgent(
            self.ctx, self.spec, self._membership_factory, self.hosts, self.recorder))
        self.recorder.end(outcome, quiet=self.spec.solo)
        return outcome

    def run_job(self) -> Outcome:
        try:  # a host that cannot take part joins all the same, to tell the job why
            introduction, unusable = ({}, self.ctx.setup_error) if self.ctx.setup_error else (self.introduction(), None)
        except ToolkitError as exc:
            introduction, unusable = {}, exc
        membership = self.membership = self.membership or self.new_seat(introduction)
        # left in reverse: the attempt's processes, the guard, what the runner made, the seat, ...
        with ExitStack() as job:
            job.callback(end_leftovers)  # last: what is left once every owner ended its own (the stall watch's
            job.callback(self.stall.close)  # tripwire is its own, not a process the job left behind)
            job.callback(membership.close)
            job.callback(self.recorder.close)
            with SignalForwarder(self._on_signal):
                outcome = self._begin(lambda: self._set_up(job, unusable))
                while outcome is None:
                    outcome = carry.carry_out(self, self._step(self.next_event()))
        return outcome

    def _set_up(self, job: ExitStack, unusable: ToolkitError | None) -> None:
        """Join, prepare what the runner holds, meet at barrier 0 and start the first attempt (its stack on ``job``)."""
        self.membership.open()
        if self.is_lead and not self.membership.is_lead:  # back after its loss: the job runs under another lead
            meeting.follow_the_running_job(self)
        self.check_stop()
        self.step_held(Joined(*self.membership.job_attempt))
        self.recorder.joined(self.membership.hosts)
        if unusable is not None:
            raise unusable
        self.seats.take_hosts(self.membership.hosts)
        self.seats.take_limits(self.spec)
        self.part.watch_dir = self.stall.start(self.membership.job_id, self.host)  # ranks reported, the stop's flags
        if self.spec.prepare is not None:
            job.enter_context(self.spec.prepare(self.seating()))
        self.check_stop()
        self._seat(meeting.first_barrier(self))
        guarded = self.spec.guard(self.seating()) if callable(self.spec.guard) else self.spec.guard
        if guarded is not None:  # imported only here: a job of one seat never loads it
            from training_toolkit.cluster.guard import start_guard

            guard = start_guard(guarded, self.ctx.plan.hosts)  # every host of the job: a spare may be seated
            if guard is not None:
                job.callback(guard.stop)
        job.callback(lambda: self._attempt.close())  # whichever attempt is the last
        if self.host in self.active:  # a spare said it waits
            self._say_attempt(why_this_attempt(self.attempt, self.state.first_attempt, self.membership.job_attempt[1]))
        self.check_stop()
        self._start()

    def _start(self) -> None:
        """Start the attempt's processes, each on this attempt's stack (stopped with the failure grace at the end).
        A spare (not among the attempt's active hosts) starts none: it stays joined, and waits."""
        procs = self.spec.processes(self.seating(attempt=True)) if self.host in self.active else ()
        self.part.locals = started = []
        self._attempt.callback(stop_locals, started, FAILURE_GRACE_S)
        for proc in procs:
            child = self.supervise(proc.argv, proc.env, cwd=proc.cwd)
            started.append(Local(proc.name, child, proc.primary, proc.rank, proc.program, proc.judge))

    def _started(self) -> Outcome | None:
        self.stall.attempt_started(self.attempt)
        self.part.watch(self.attempt)
        primaries = tuple(local.name for local in self.locals if local.primary)
        actions = self.step_held(Started(primaries, self.active, meeting.may_fail_over(self)))
        return carry.carry_out(self, actions)

    def _seat(self, attempt: Attempt) -> None:
        self.state = decisions.take_seat(self.state, attempt)
        self.seats.seat(attempt, self._attempts())
        self.recorder.seated(attempt)

    def _say_attempt(self, reason: str) -> None:
        self.seats.say_attempt(self.attempt, self._attempts(), reason)

    def _attempts(self) -> int:
        return self.state.first_attempt + self.ctx.settings.max_restarts + 1
    # The shell --------------------------------------------------------------------------------

    def _step(self, event: decisions.Event) -> tuple[decisions.Action, ...]:
        before = self.state  # the record reads the attempt, and the stops on, as they were before this step
        wall, now = time.time(), time.monotonic()  # one instant: the decision's clock and the record's
        self.state, actions = decisions.step(before, event, now)
        self.recorder.step(event, actions, before.attempt, before.phase == Phase.STOPPING, wall, before.stop_signal is not None)
        return actions

    def step_held(self, event: decisions.Event) -> tuple[decisions.Action, ...]:
        with signals_held():  # the handler steps too while setting up: never both at once
            return self._step(event)

    def next_event(self) -> decisions.Event:
        deadline = decisions.next_deadline(self.state)
        try:
            event = self.events.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except Empty:
            return Tick()
        if isinstance(event, PeerLost) and not self.is_lead and event.host != self.seats.attempt.lead:
            return Tick()  # the loss of a lead this follower no longer follows (it met the next one at a barrier)
        if isinstance(event, LocalExit) and event.attempt == self.attempt:
            local = next(local for local in self.locals if local.name == event.name)  # the process says what failed
            failed = self.failure_of(local, event.status)
            if failed is not None:  # an exit 0 that is a failure gets the failure's code
                status = event.status if not event.status.ok else ExitStatus(failed.outcome.exit_code)
                event = LocalExit(event.name, status, event.at, failed.outcome, event.attempt, failed.host)
        return event

    def failure_of(self, local: Local, status: ExitStatus) -> Blamed | None:
        """A local process's end as a failure (None: a success), as the process tells it (``Local.judge``: mpirun
        blames the failing rank's host), else by its status, naming this host."""
        if local.judge is not None:
            return local.judge(local, status)
        return None if status.ok else Blamed(described_failure(local, status, None if self.spec.solo else self.host))

    def fail_over(self, attempt: int, reason: str, lost: str) -> Outcome | None:
        """This host's lead ``lost`` is gone and its part stopped: find the next lead (maybe this host), meet at the
        barrier of the new attempt under it, and start this host's part again (``meeting.next_lead``)."""
        return self._begin(lambda: self._meet(reason, lost))

    def rejoin(self, attempt: int, reason: str) -> Outcome | None:
        """Meet every host at the barrier of the new attempt and start this host's part again."""
        return self._begin(lambda: self._meet(reason))

    def _meet(self, reason: str, lost: str | None = None) -> None:
        """The steps of ``rejoin`` (and of ``fail_over``: ``lost``, the lead that was lost) up to the attempt's start."""
        self._say_attempt(reason)
        self._attempt.close()  # the last attempt's processes are gone (StopPart): what the runner set up for it goes
        self.part.locals = []
        self.part.lower_flags()
        if lost is None:  # a host may still be giving its ranks their grace: that is not a host that did not come back
            self._seat(meeting.restart_barrier(self))
        else:
            self._seat(meeting.next_lead(self, lost))
        self.check_stop()
        self._start()

    def _begin(self, steps: Callable[[], None]) -> Outcome | None:
        """Run the steps up to an attempt's start, then the start's own step; the outcome if either ended the job."""
        try:
            steps()
        except Ended as ended:
            return ended.outcome
        except ToolkitError as exc:
            return self._failed_before_start(exc)
        except OSError as exc:  # a program that cannot be started (missing, not executable)
            return self._failed_before_start(carry.cannot_start(self.ctx.argv, self.spec.solo, exc, self.ctx.script_env))
        return self._started()

    def _on_signal(self, signum: int) -> None:
        """A signal is an event: the loop steps it.  During setup's blocking steps (the join, the runner's
        prepare, a host's wait for the go), a stopping one also ends the seat's wait (``interrupt``) and is stepped
        at the next safe point (``_check_stop``); the handler never raises into setup."""
        self.events.put(GotSignal(signum))
        if (signum in STOPPING_SIGNALS and self.state.phase in (Phase.SETUP, Phase.BARRIER) and not self.in_barrier
                and self._stop_signum is None):
            self._stop_signum = signum
            if self.membership is not None:
                self.membership.interrupt()

    def check_stop(self) -> None:
        """Between setup's steps: a stopping signal that came is stepped now (``Interrupt`` raises ``Stopped``)."""
        if self._stop_signum is not None:
            carry.carry_out(self, self.step_held(GotSignal(self._stop_signum)))

    def _failed_before_start(self, exc: ToolkitError) -> Outcome:
        if isinstance(exc, JobFailed):  # the verdict came while this host waited: it says the lead's summary
            self.recorder.lead_summary = exc.summary
            if exc.exit_code == 0:  # a spare waiting at a barrier heard the job succeed
                return Outcome(0)
        if self._stop_signum is not None and not isinstance(exc, Stopped):  # a wait the stop ended (Interrupted)
            try:
                self.check_stop()
            except Stopped as stopped:
                exc = stopped
        reason = carry.setup_failure(self.host, self.spec.solo, exc)
        outcome = carry.carry_out(self, self.step_held(SetupFailed(Outcome(exc.exit_code, reason), time.time())))
        assert outcome is not None
        return outcome


__all__ = ["Ended", "HostAgent", "Stopped", "run"]
