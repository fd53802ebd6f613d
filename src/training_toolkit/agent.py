"""HostAgent: the template every multi-host runner follows on every host.

    join the channel -> prepare (e.g. sshd) -> barrier -> start local processes
    -> monitor (local exits, peers, signals) -> verdict -> stop and clean up

Runners override the small steps (``prepare``, ``after_barrier``, ``start``,
``failure_of``, ``cleanup``); the order, the failure handling and the verdict
are here, once.  The first host decides the verdict and sends it to the
others; the others report their failures to it.  Nothing is left running:
every local process is stopped and reaped before ``run`` returns.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from queue import Empty, SimpleQueue

from training_toolkit.cluster.channel import PeerDone, PeerFailed, PeerLost, Verdict
from training_toolkit.cluster.membership import ChannelSettings, Membership
from training_toolkit.cluster.secret import job_secret
from training_toolkit.errors import EXIT_CLUSTER_ERROR, ClusterError, CodeError, JobFailed, ToolkitError
from training_toolkit.log import log
from training_toolkit.process import STOPPING_SIGNALS, ExitStatus, SignalForwarder, Supervised, end_descendants
from training_toolkit.report import Outcome
from training_toolkit.runners.base import RunContext, outcome_of

FAILURE_GRACE_S = 2.0  # stopping local processes because the job failed elsewhere
REPORT_WAIT_S = 5.0  # a host that failed waits this long for the verdict before ending on its own
PEER_FINISH_TIMEOUT_S = 600.0  # after success on the first host, how long others may take to finish


@dataclass(frozen=True)
class LocalExit:
    name: str
    status: ExitStatus


@dataclass(frozen=True)
class GotSignal:
    signum: int


@dataclass(frozen=True)
class PartStopped:
    """A runner's own report: this host's part of the job was stopped by a signal."""

    signum: int


@dataclass
class Local:
    """A process this host runs for the job; the host's part ends when its primary ends."""

    name: str
    child: Supervised
    primary: bool = True


class Stopped(ToolkitError):
    """A stopping signal arrived before the job started."""

    def __init__(self, signum: int):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before the job started")


class HostAgent:
    wait_for_peers = False  # on success, does the first host wait for every host's own success?

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.host = ctx.plan.current_host
        self.is_master = ctx.plan.is_master
        self.secret = job_secret(ctx.job, ctx.environ)  # None: the platform gave none
        self.membership: Membership | None = None  # this host's seat, from run() on
        self.events: SimpleQueue = SimpleQueue()
        self.settings = ChannelSettings.from_settings(ctx.settings)
        self.locals: list[Local] = []
        self._setup_phase = True
        self._stop_signal: int | None = None  # a stopping signal this host received: the job did not complete

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

    def failure_of(self, local: Local, status: ExitStatus) -> Outcome:
        """The outcome of a local process that failed, its reason naming this host."""
        if local.name.startswith("rank "):
            return outcome_of(local.child, status, label=f"{self.host} {local.name}")
        return outcome_of(local.child, status, label=self.host, what=None if local.name == "script" else local.name)

    def cleanup(self) -> None:
        """After every local process is gone (every host, always)."""

    def signal_job(self, signum: int) -> None:
        """Pass a signal ``train`` received to this host's part of the job.

        By default every local process gets it (stopping signals with the grace
        period, then SIGKILL).  A runner whose processes are not its children
        (MPI ranks under sshd) posts ``PartStopped`` once they are gone.
        """
        self._forward(signum, self.ctx.grace_s)

    # The template -----------------------------------------------------------------------------

    def run(self) -> Outcome:
        if self.secret is None and self.is_master:
            log("no job secret from the platform: hosts are admitted by address and every key is random "
                "(docs/security.md)")
        try:
            introduction, unusable = self.introduction(), None
        except ToolkitError as exc:  # join all the same, to tell the job why this host cannot take part
            introduction, unusable = {}, exc
        membership = self.membership = Membership(self.secret, self.ctx.plan.hosts, self.host, self.settings,
                                                  self.events, introduction)
        try:
            with SignalForwarder(self._on_signal):
                try:
                    membership.open()
                    if unusable is not None:
                        raise unusable
                    self.prepare()
                    membership.barrier()
                    if self.is_master:
                        self.after_barrier()
                    self.locals = self.start()
                except ToolkitError as exc:
                    return self._failed_before_start(membership, exc)
                except OSError as exc:  # a program that cannot be started (missing, not executable)
                    error = CodeError(f"cannot start {exc.filename or 'a process'}: {exc.strerror or exc}")
                    return self._failed_before_start(membership, error)
                finally:
                    self._setup_phase = False
                for local in self.locals:
                    _watch(local, self.events)
                outcome = self._monitor_master(membership) if self.is_master else self._monitor_worker(membership)
        finally:
            self._stop_locals(FAILURE_GRACE_S)
            self.cleanup()
            membership.close()
            ended = end_descendants()
            if ended:
                log(f"ended processes the job left behind: {', '.join(ended)}")
        return outcome

    def _on_signal(self, signum: int) -> None:
        if self._setup_phase and signum in STOPPING_SIGNALS:
            raise Stopped(signum)
        self.events.put(GotSignal(signum))

    def _failed_before_start(self, membership: Membership, exc: ToolkitError) -> Outcome:
        reason = str(exc) if isinstance(exc, JobFailed) else named(self.host, exc)
        membership.fail(reason, exc.exit_code)
        return Outcome(exc.exit_code, reason)

    def _forward(self, signum: int, grace_s: float) -> None:
        for local in self.locals:
            if signum in STOPPING_SIGNALS:
                local.child.stop(signum, grace_s)
            else:
                local.child.send(signum)

    def _on_got_signal(self, signum: int) -> None:
        if signum in STOPPING_SIGNALS and self._stop_signal is None:
            self._stop_signal = signum
        self.signal_job(signum)

    def _stopped(self, signum: int) -> Outcome:
        return Outcome(128 + signum, f"{self.host}: stopped by {signal.Signals(signum).name}")

    def _local(self, name: str) -> Local:
        return next(local for local in self.locals if local.name == name)

    def _part_done(self, finished: set[str]) -> bool:
        """This host's part is done when every primary process has ended well."""
        return all(local.name in finished for local in self.locals if local.primary)

    def _monitor_master(self, membership: Membership) -> Outcome:
        workers = set(self.ctx.plan.hosts[1:])
        done: set[str] = set()
        finished: set[str] = set()
        succeeded = False
        outcome: Outcome | None = None
        while outcome is None:
            try:
                event = self.events.get(timeout=PEER_FINISH_TIMEOUT_S if succeeded else None)
            except Empty:
                missing = ", ".join(sorted(workers - done))
                outcome = Outcome(EXIT_CLUSTER_ERROR, f"{self.host}: the job succeeded here but {missing} did not finish "
                                                      f"within {PEER_FINISH_TIMEOUT_S:g} s")
                break
            if isinstance(event, GotSignal):
                self._on_got_signal(event.signum)
            elif isinstance(event, PartStopped):
                outcome = self._stopped(event.signum)
            elif isinstance(event, LocalExit) and self._stop_signal is not None:
                outcome = self._stopped(self._stop_signal)  # however the processes ended, the job was stopped
            elif isinstance(event, LocalExit):
                local = self._local(event.name)
                if not event.status.ok or not local.primary:
                    outcome = self._local_failure(local, event.status)
                    continue
                finished.add(local.name)
                if not self._part_done(finished):
                    continue
                if self.wait_for_peers and not workers <= done:
                    succeeded = True
                else:
                    outcome = Outcome(0)
            elif isinstance(event, PeerDone):
                done.add(event.host)
                if event.exit_code != 0:
                    outcome = Outcome(event.exit_code, f"{event.host}: exited with code {event.exit_code}")
                elif succeeded and workers <= done:
                    outcome = Outcome(0)
            elif isinstance(event, PeerFailed):
                outcome = Outcome(event.exit_code, event.reason if event.reason.startswith(event.host) else f"{event.host}: {event.reason}")
            elif isinstance(event, PeerLost) and event.host not in done:
                outcome = Outcome(EXIT_CLUSTER_ERROR, f"{event.host}: left the job ({event.reason})")
        membership.announce(Verdict(outcome.exit_code, outcome.reason, self.host))
        return outcome

    def _local_failure(self, local: Local, status: ExitStatus) -> Outcome:
        if status.ok:  # a helper process (not the primary) ended on its own
            return Outcome(EXIT_CLUSTER_ERROR, f"{self.host}: {local.name} ended before the job did")
        return self.failure_of(local, status)

    def _monitor_worker(self, membership: Membership) -> Outcome:
        own: Outcome | None = None
        finished: set[str] = set()
        while True:
            try:
                event = self.events.get(timeout=REPORT_WAIT_S if own is not None else None)
            except Empty:
                return own  # the first host never answered our failure report
            if isinstance(event, GotSignal):
                # The part's processes get the signal and their grace; their ends tell the job.
                self._on_got_signal(event.signum)
            elif isinstance(event, PartStopped) or (isinstance(event, LocalExit) and self._stop_signal is not None):
                if own is None:
                    own = self._stopped(event.signum if isinstance(event, PartStopped) else self._stop_signal)
                    membership.report_failure(own.reason or "", own.exit_code)
            elif isinstance(event, LocalExit):
                local = self._local(event.name)
                if event.status.ok and local.primary:
                    finished.add(local.name)
                    if self._part_done(finished):
                        membership.report_done(0)
                elif own is None:
                    own = self._local_failure(local, event.status)
                    membership.report_failure(own.reason or "", own.exit_code)
            elif isinstance(event, Verdict):
                if event.exit_code == 0:
                    return Outcome(0)
                return Outcome(event.exit_code, event.reason or f"the job failed with code {event.exit_code}")
            elif isinstance(event, PeerLost):
                return own or Outcome(EXIT_CLUSTER_ERROR, f"{self.host}: {event.reason}")

    def _stop_locals(self, grace_s: float) -> None:
        for local in self.locals:
            if local.child.poll() is None:
                local.child.stop(signal.SIGTERM, grace_s)
        for local in self.locals:
            local.child.wait(grace_s + 5)
            local.child.finish(linger_s=1.0)


def named(host: str, error: Exception) -> str:
    """An error's message as a job-wide reason: it starts with the host it happened on."""
    text = str(error)
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


def fail_job(job, plan, environ, config, error: ToolkitError) -> None:
    """Tell the other hosts that this one failed before its runner started (e.g. its code did not install).

    Without it they would wait for this host until the join deadline and then
    only say that it never came.
    """
    host = plan.current_host
    events: SimpleQueue = SimpleQueue()
    settings = ChannelSettings.from_settings(config)
    membership = Membership(job_secret(job, environ), plan.hosts, host, settings, events)
    try:
        membership.open()
        membership.fail(named(host, error), error.exit_code)
        if not membership.is_master:
            try:
                events.get(timeout=REPORT_WAIT_S)  # the verdict, or the first host gone
            except Empty:
                pass
    except ToolkitError:
        pass  # the job could not be told; this host's own verdict still stands
    finally:
        membership.close()


def _watch(local: Local, events: SimpleQueue) -> None:
    def wait() -> None:
        events.put(LocalExit(local.name, local.child.wait()))

    threading.Thread(target=wait, name=f"watch-{local.name}", daemon=True).start()


__all__ = ["HostAgent", "Local", "LocalExit", "GotSignal", "PartStopped", "Stopped", "ClusterError", "log"]
