"""This host's seat in the job: the channel's server on the lead, a client elsewhere.

Runners see one small interface whatever the host's role: open, barrier (the
the lead: release, once the agent decided its barrier passed), report, end.
Deadlines and ports are settings (``config/settings.py``), so a platform can set them
without flags.  A job of one host has no seat here (``agent.seats.SoloSeat``):
it imports none of this.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from queue import SimpleQueue
from typing import TYPE_CHECKING

from training_toolkit.job.attempt import Attempt
from training_toolkit.cluster import elsewhere
from training_toolkit.cluster.events import Verdict
from training_toolkit.cluster.timing import ChannelSettings
from training_toolkit.core.errors import EXIT_NO_MAJORITY, ClusterError
from training_toolkit.core.log import log

if TYPE_CHECKING:
    from training_toolkit.cluster.client import ControlClient
    from training_toolkit.cluster.server import ControlServer


VERDICT_LINGER_S = 10.0

#: A host other than the first waits this much longer than the barrier's deadline for the lead's word.
FIRST_HOST_MARGIN_S = 5.0


class Membership:
    """This host's seat.  ``secret`` is the platform's job secret, or None (seats admitted by address).

    ``introduction`` is what this host tells the others about itself; after
    ``open``, ``introductions`` holds what the others told (on the lead:
    every host that joined, by name; elsewhere: the lead's, and from the first go on every
    seated host's, as the go carried them), and
    ``job_id`` is the lead's random id for this job, the same on every host,
    and ``hosts`` the job's hosts as the lead's welcome listed them (``job_hosts``).
    """

    def __init__(self, secret: bytes | None, hosts: Sequence[str], current: str, settings: ChannelSettings,
                 events: SimpleQueue, introduction: Mapping[str, str] | None = None, looking: bool = False):
        import secrets  # with the channel: a job of one seat imports neither (secrets: hmac, hashlib, random)

        from training_toolkit.cluster.client import ControlClient  # a job of one seat has none
        from training_toolkit.cluster.server import ControlServer

        self.hosts = tuple(hosts)
        self.current = current
        self.settings = settings
        self.is_lead = current == self.hosts[0] and not looking  # looking: it joins a running job or none (``look``)
        self._looking = looking
        kw = dict(heartbeat_s=settings.heartbeat_s, timeout_s=settings.peer_timeout_s, introduction=introduction)
        self._secret, self._events, self._kw = secret, events, kw  # for a new lead's channel (``take_lead``, ``follow``)
        self._took_over = False  # this host took the lead from a lost one (``take_lead``)
        if self.is_lead:
            self._server: ControlServer | None = ControlServer(secret, self.hosts[1:], settings.port, events,
                                                               job_id=secrets.token_hex(8), hosts=self.hosts,
                                                               first_attempt=settings.first_attempt, **kw)
            self._client: ControlClient | None = None
        else:
            self._server = None
            self._client = None if looking else ControlClient(secret, current, self.hosts[0], settings.port, events,
                                                              **kw)

    @property
    def job_id(self) -> str:
        return self._server.job_id if self._server else self._client.job_id  # type: ignore[union-attr]

    @property
    def introductions(self) -> Mapping[str, Mapping[str, str]]:
        if self._server:
            return dict(self._server.introductions)
        assert self._client is not None  # the others' from the last go (each host's keys: runners/mpi_ssh.py)
        return {**self._client.peers, self._client.lead: self._client.introduction}

    @property
    def job_attempt(self) -> tuple[int, bool]:
        """After ``open``: the job's attempt when this host took its seat, and whether it had started (0, False here)."""
        return self._client.job_attempt if self._client else (0, False)

    def open(self) -> None:
        """Serve (unless the job already runs under another lead: ``_join_a_running_job``), or join within the join
        deadline."""
        if self._server:
            self._server.start()
            self._join_a_running_job()
        elif self._looking:
            assert self._client is not None, "a looking seat opens once its look found the lead (``look``)"
        else:
            self._join_the_lead()
            self.hosts = job_hosts(self.hosts, self.current, self._client.hosts)

    def look(self, window_s: float, stopped: threading.Event) -> bool:
        """A seat made ``looking`` (its host out of the job, which it may have left cut off from the others): whether
        a host leads the job, started, within ``window_s`` (asked again every ``elsewhere.LOOK_S``, until ``stopped``);
        if so, this seat follows it (``open`` then joins nothing more), and joins as a spare at the next restart."""
        assert self._looking and self._client is None
        found = elsewhere.look_for(self._client_for, [host for host in self.hosts if host != self.current],
                                   self.settings.first_attempt, window_s, stopped)
        if found is None:
            return False
        self._client, self.hosts = found, job_hosts(self.hosts, self.current, found.hosts)
        return True

    def _join_the_lead(self) -> None:
        """Join the platform's first host within the join deadline; should it not answer for ``LOOK_S`` at a time (it
        may be lost, and the job running under another lead: this host's ``train`` came back after its own loss), ask
        the other hosts whether one of them leads the running job, and follow it if so (``elsewhere.running_job``).
        A join that is refused is refused at once, as before."""
        import time

        from training_toolkit.cluster.client import Unreachable

        assert self._client is not None
        deadline_s = self.settings.join_timeout_s
        end = time.monotonic() + deadline_s
        while True:
            try:
                self._client.connect(max(0.5, min(elsewhere.LOOK_S, end - time.monotonic())))
                return
            except Unreachable as exc:
                if time.monotonic() >= end - 0.5:
                    raise Unreachable(self._client.lead, self.settings.port, deadline_s, exc.last) from None
            found = self._running_job_elsewhere([host for host in self.hosts[1:] if host != self.current])
            if found is not None:
                log(f"{self.current}: {self._client.lead} does not answer; the job runs under {found.lead}: joining it")
                self._client.close()
                self._client = found
                return

    def barrier(self, attempt: int = 0, deadline_s: float | None = None) -> Attempt:
        """A host other than the lead: say it is ready for ``attempt``, and wait for the lead's go.

        The attempt as the go tells it (its number, its active hosts in rank order, its spares): a go newer than
        ``attempt`` is the lead's, which went on without this host meanwhile, and this host takes it.  The lead's
        barrier is the agent's decision (``agent.barrier``), on what its server posts; it then ``release``s.
        """
        deadline_s = self.settings.join_timeout_s if deadline_s is None else deadline_s
        assert self._client is not None
        self._client.ready(attempt)
        # the lead decides the barrier and names who is missing; this host's own deadline, a
        # margin later, is for a lead that went silent (its verdict would otherwise race ours)
        return self._client.wait_seats(deadline_s + FIRST_HOST_MARGIN_S, attempt)  # the welcome named its hosts

    def release(self, attempt: Attempt) -> None:
        """The lead: the barrier passed; every host hears the attempt (``Attempt``: every field) and starts."""
        if self._server:
            self._server.release(attempt)

    def report_failure(self, reason: str, exit_code: int, at: float | None = None, attempt: int = 0,
                       stopped: bool = False) -> None:
        """Other hosts: tell the lead this one failed, and when (wall clock; None: now)."""
        if self._client:
            self._client.failed(reason, exit_code, at, attempt, stopped)

    def restart(self, attempt: int, reason: str, cause: str | None = None) -> None:
        """The lead: every host stops its part and meets at the barrier of ``attempt`` (``cause``: whose ranks failed)."""
        if self._server:
            self._server.restart(attempt, reason, cause)

    def progress(self, heartbeat: bool, checkpoint: bool = False) -> None:
        """Other hosts: tell the lead this host saw progress (``checkpoint``: a rank marked a checkpoint saved)."""
        if self._client:
            self._client.progress(heartbeat, checkpoint)

    def share_mark(self, host: str, attempt: int) -> None:
        """The lead: every other host hears a checkpoint was marked on ``host`` in ``attempt`` (``MarkShared``)."""
        if self._server:
            self._server.mark(host, attempt)

    def request_stacks(self, timeout_s: float) -> Mapping[str, object]:
        """The lead: every other host's ranks' stacks, as sent (checked by the caller), within ``timeout_s``."""
        return self._server.request_stacks(timeout_s) if self._server else {}

    def send_stacks(self, stacks: list) -> None:
        if self._client:
            self._client.send_stacks(stacks)

    def report_done(self, exit_code: int) -> None:
        if self._client:
            self._client.done(exit_code)

    def fail(self, reason: str, exit_code: int, at: float | None = None) -> None:
        """This host failed: the lead makes it the job's verdict, the others report it there."""
        if self._server:
            self.announce(Verdict(exit_code, reason, self.current))
        else:
            self.report_failure(reason, exit_code, at)

    def announce(self, verdict: Verdict, linger: bool = True) -> None:
        """Tell every host the verdict; hosts still on their way get it when they join (bounded wait), if ``linger``
        (not after this host's own stop: the platform's kill would come first, ``Announce.linger``)."""
        if self._server:
            self._server.broadcast(verdict)
            if not linger:
                return
            # a lead that took over keeps it for the lost lead made again (TRAINING_TOOLKIT_VERDICT_WAIT); any other
            # lead for the hosts still on their way, the join deadline and at most VERDICT_LINGER_S, and so does one
            # with no majority: its verdict is its own leaving, which a host made again has no use for (and which
            # would hold its own pod from being made again)
            self._server.linger(self.settings.verdict_wait_s if self._took_over and verdict.exit_code != EXIT_NO_MAJORITY
                                else min(self.settings.join_timeout_s, VERDICT_LINGER_S))

    def _join_a_running_job(self) -> None:
        """The platform's first host, its channel open: is the job already running under another lead (this host's
        ``train`` came back after its loss: a pod made again, a node replaced)?  Then it follows that lead, and
        joins as a spare at the next restart, instead of starting a second job.

        It asks every other host, side by side, and follows the first in the platform's order that leads a started
        job (``elsewhere.running_job``): at a job's start none of them serves, so each answer is a refused
        connection, at once (``elsewhere.PROBE_S`` bounds one whose address drops it)."""
        assert self._server is not None
        client = self._running_job_elsewhere(self.hosts[1:])
        if client is not None:
            self._server.close()
            self._server, self._client, self.is_lead = None, client, False
            self.hosts = job_hosts(self.hosts, self.current, client.hosts)

    def _running_job_elsewhere(self, hosts: Sequence[str]) -> ControlClient | None:
        return elsewhere.running_job(self._client_for, hosts, self.settings.first_attempt)

    def _client_for(self, host: str) -> ControlClient:
        from training_toolkit.cluster.client import ControlClient

        return ControlClient(self._secret, self.current, host, self.settings.port, self._events, **self._kw)

    def introduce(self, introduction: Mapping[str, str]) -> None:
        """What this host tells the leads it joins from now on, and the hosts that join it should it lead
        (``follow``, ``take_lead``): what it learnt since it joined (MPI: the job's ranks per host, which a host made
        again after the lead's loss can learn from no one else).  Its present link keeps what it said."""
        self._kw["introduction"] = dict(introduction)

    def take_lead(self, attempt: int) -> None:
        """This host leads from ``attempt`` on (its lead was lost, ``agent/succession.py``): its link to the lost lead
        closes, and it serves the job's channel, under the job's id, the others' barrier of ``attempt`` to come."""
        from training_toolkit.cluster.server import ControlServer

        job_id = self.job_id
        if self._client:
            self._client.close()
        others = [host for host in self.hosts if host != self.current]
        server = ControlServer(self._secret, others, self.settings.port, self._events, job_id=job_id,
                               hosts=self.hosts, first_attempt=attempt, **self._kw)
        server.start()
        self._server, self._client, self.is_lead, self._took_over = server, None, True, True

    def follow(self, lead: str, attempt: int, deadline_s: float) -> None:
        """Join ``lead``'s channel, the next lead after this host's was lost, for ``attempt``: the same job (its id),
        at ``attempt`` or later (the attempt is the term: a lead of an older one is no lead).  ClusterError if it does
        not answer within ``deadline_s`` or answers otherwise."""
        from training_toolkit.cluster.client import ControlClient

        job_id, last = self.job_id, self._client
        if last:
            last.close()
        client = self._client = ControlClient(self._secret, self.current, lead, self.settings.port, self._events,
                                              **self._kw)  # ``interrupt`` ends its join
        try:
            client.connect(deadline_s)
        except ClusterError:
            self._client = last  # the job's id, for the next lead tried
            raise
        if client.job_id == job_id and client.job_attempt[0] >= attempt:
            return
        client.close()
        self._client = last
        raise ClusterError(f"{lead} leads another job or an older attempt (job {client.job_id!r}, attempt "
                               f"{client.job_attempt[0] + 1}), not this job's attempt {attempt + 1}")

    def interrupt(self) -> None:
        """End a join or a wait for the go now (a stopping signal during setup); safe from a signal handler."""
        if self._client:
            self._client.interrupt()

    def close(self) -> None:
        if self._server:
            self._server.close()
        if self._client:
            self._client.close()


def job_hosts(own: Sequence[str], current: str, given: Sequence[str]) -> tuple[str, ...]:
    """The job's hosts for a host other than the first: the lead's welcome (``given``), never its own view.

    A host's own view may be partial (an MPIJob worker knows only the launcher and itself) or
    ordered otherwise; the lead's list is the job's, so every host admits and addresses
    the same peers in the same order.  A welcome that lists no hosts, or not this one, is refused.
    """
    if not given:
        raise ClusterError(f"the lead {own[0]} named no hosts in its welcome (a host of another toolkit version?)")
    if current not in given:
        raise ClusterError(f"the lead {given[0]} does not list this host, {current}, among the job's hosts: "
                           f"{', '.join(given)}")
    return tuple(given)
