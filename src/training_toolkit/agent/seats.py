"""Who takes part in each attempt (``agent/roster.py``): the lead chooses each ``Attempt``, every host takes it.

And the seat of a job of one host (``SoloSeat``), which has no other host to take part.

``Seats`` holds this host's view of the job's hosts (the lead's list, once
taken), the limits of active hosts, the roster, the current ``Attempt`` and
that attempt's own ``RunContext`` (``runspec.for_attempt``: its active hosts
only); the agent asks it, and logs what it says.  Writing the resource config
of ``/opt/ml`` for an attempt is done here, once per change of its hosts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from queue import SimpleQueue
from typing import TYPE_CHECKING

from training_toolkit.job.attempt import MAX_CAUSES, Attempt, seated
from training_toolkit.core.errors import ClusterError, ConfigError, NoMajority
from training_toolkit.core.log import log
from training_toolkit.runspec import RunContext, RunnerSpec, for_attempt, with_hosts, write_resource_config

if TYPE_CHECKING:
    from training_toolkit.agent import roster
    from training_toolkit.agent.events import Release


class Seats:
    def __init__(self, ctx: RunContext, hosts: Sequence[str], first_attempt: int = 0):
        self.ctx = ctx  # the job's every host (a spare may be seated later)
        self.host = ctx.plan.current_host
        self.hosts = tuple(hosts)  # the job's hosts as seen here
        self.is_lead = self.hosts[0] == self.host
        self.attempt: Attempt = seated(first_attempt, self.hosts)  # before any barrier: every host
        self.attempt_ctx = ctx  # this attempt's view of the job: its active hosts only (``for_attempt``)
        self.roster: roster.Roster | None = None  # the lead's, from barrier 0 (a job of one host has none)
        self.max_hosts, self.min_hosts = len(self.hosts), len(self.hosts)
        self.elastic = False  # spares, or a minimum below the maximum: a lost host need not end the job
        self._turn: roster.Turn | None = None  # the lead's last choice, for the attempt's line

    @property
    def active(self) -> tuple[str, ...]:
        return self.attempt.active

    def take_hosts(self, hosts: Sequence[str]) -> None:
        """A host other than the lead takes the job's hosts from the lead's welcome, never from its own view."""
        hosts = tuple(hosts)
        if self.is_lead or hosts == self.ctx.plan.hosts:
            return
        log(f"{self.host}: host of {', '.join(hosts)} (from the lead)")
        self.ctx = self.attempt_ctx = with_hosts(self.ctx, hosts)
        write_resource_config(self.ctx.job)
        self.hosts = hosts
        self.attempt = seated(self.attempt.number, hosts)

    def take_limits(self, spec: RunnerSpec) -> None:
        """The job's maximum and minimum of active hosts, checked on every host against the job's hosts (the first
        host's list, taken already) before anything starts: a ConfigError, exit 78, that the lead announces."""
        config = self.ctx.settings
        if spec.solo or (config.max_hosts is None and config.min_hosts is None):
            return
        from training_toolkit.agent import roster  # a job of one host never loads it

        try:
            self.max_hosts, self.min_hosts = roster.limits(len(self.hosts), config.max_hosts, config.min_hosts)
        except ValueError as exc:
            raise ConfigError("settings", None, f"{exc}: the job's hosts are {', '.join(self.hosts)}") from None
        self.elastic = roster.elastic(len(self.hosts), self.max_hosts, self.min_hosts)
        if self.elastic and self.ctx.job.resource.instance_groups:
            raise ConfigError("settings", None, "TRAINING_TOOLKIT_MAX_HOSTS and TRAINING_TOOLKIT_MIN_HOSTS need a "
                              "job without instance groups (a group names its hosts)")
        self.roster = roster.first_roster(self.hosts, self.max_hosts)

    def choose(self, number: int, first: bool, release: Release, cause_hosts: Sequence[str | None]) -> Attempt:
        """The lead, its barrier passed: attempt ``number`` (the first roster at barrier 0, else the next)."""
        chosen = self.first_choice() if first else self.next_choice(release.ready, release.why, cause_hosts)
        return Attempt(number, chosen.active, chosen.spares, chosen.retired, tuple(cause_hosts)[-MAX_CAUSES:])

    def first_choice(self) -> roster.Roster:
        """Barrier 0: the first roster (every host joined and ready)."""
        from training_toolkit.agent import roster

        self.roster = self.roster or roster.Roster(self.hosts)
        self._turn = roster.Turn(self.roster)
        return self.roster

    def take_first_choice(self) -> None:
        """Barrier 0's lead was lost before its go reached this host: the attempt it would have chosen (its barrier
        waits for every host, so every host is ready when it passes: the first roster) is the last attempt."""
        chosen = self.first_choice()
        self.attempt = Attempt(self.attempt.number, chosen.active, chosen.spares)

    @property
    def members(self) -> tuple[str, ...]:
        """The hosts the job counts on for the next attempt: the last attempt's active hosts and spares."""
        return (*self.attempt.active, *self.attempt.spares)

    def followers_may_lead(self) -> bool:
        """Should this attempt's lead be lost, may a follower lead the job on (``succession``)?  Only if the job may go
        on with fewer hosts (a job of one seat never may) and the members left without the lead are a majority.
        Only then can a second lead exist, and only then must a lead have a majority behind it."""
        from training_toolkit.agent.succession import may_go_on

        return self.elastic and may_go_on(self.members, (self.attempt.lead,))

    def take_lead(self, lost: str) -> None:
        """This host leads from now on, its lead ``lost``: it takes the lost lead's seat (``roster.led_by``)."""
        from training_toolkit.agent import roster

        self.is_lead = True  # the last attempt as every host took it, the hosts the lost lead retired included
        last = roster.Roster(self.attempt.active, self.attempt.spares, self.attempt.retired)
        self.roster = roster.led_by(last, self.host) if last.active[0] == lost else last

    def next_choice(self, alive: frozenset, why: Mapping[str, str], cause_hosts: Sequence[str | None]) -> roster.Roster:
        """A restart's barrier: the next roster from the hosts alive and ready; too few ends the job, named, and so
        does a lead without a majority of the job's members behind it (it may be the one cut off: ``succession``)."""
        from training_toolkit.agent import roster
        from training_toolkit.agent.succession import has_majority

        last = self.roster or roster.Roster(self.hosts)
        for host in self.hosts:  # a host that left and came back waits as a spare
            if host in alive and host not in (*last.active, *last.spares, *last.retired):
                last = roster.joined(last, host)
        retire = roster.to_retire(tuple(cause_hosts)) if self.elastic else frozenset()
        members = self.members  # the majority first: a lead cut off is short of hosts too, and may be the one cut off
        if self.followers_may_lead() and not has_majority(alive, members):
            lost = [host for host in members if host not in alive]
            raise NoMajority(f"{self.host}: no majority to lead the job: {len(set(alive) & set(members))} of its "
                             f"{len(members)} members answer ({', '.join(lost)} lost); this host may be the one "
                             f"cut off from the others, so it stops")
        turn = roster.next_roster(last, alive, max_hosts=self.max_hosts, min_hosts=self.min_hosts, retire=retire,
                                  why=why)
        if isinstance(turn, roster.Shortfall):
            raise ClusterError(turn.reason())
        self.roster, self._turn = turn.roster, turn
        return turn.roster

    def first_deadline(self, attempt: int, first_attempt: int) -> float | None:
        """This ``train``'s first barrier's deadline (None: the join deadline).  A host that rejoins waits for the
        restart its loss caused: the lead stops its part first (grace).  With spares or a minimum it is a spare
        until a restart seats it: it waits however long the job runs (the lead's loss still ends the wait)."""
        if attempt <= first_attempt:
            return None
        return float("inf") if self.elastic else self.ctx.settings.join_timeout_s + self.ctx.grace_s

    def say_attempt(self, attempt: int, total: int, reason: str) -> None:
        """One line per attempt, when restarts are on: which, of how many, and why."""
        if total > 1:
            log(f"{self.host}: attempt {attempt + 1} of {total} starting" + (f" ({reason})" if reason else ""))

    def seat(self, attempt: Attempt, total: int) -> None:
        """Take the attempt: an active host's processes see its active hosts only; a spare waits."""
        was_spare = not self.attempt.runs_on(self.host)
        self.attempt = attempt
        number, active = attempt.number, attempt.active
        if self.is_lead and self.elastic and self._turn is not None:
            from training_toolkit.agent import roster

            log(f"{self.host}: {roster.attempt_line(number + 1, total, self._turn)}")
        if not attempt.runs_on(self.host):
            if not was_spare:  # once, when it starts waiting (at the first attempt, or retired)
                log(f"{self.host}: a spare: waiting (attempt {number + 1} runs on {', '.join(active)})")
            return
        if was_spare:
            log(f"{self.host}: seated in attempt {number + 1} (rank order: {', '.join(active)})")
        # every host of the job (a job of one seat: its own) is the job as it is
        attempt_ctx = self.ctx if active == self.hosts else for_attempt(self.ctx, attempt)
        if attempt_ctx.job.resource.hosts != self.attempt_ctx.job.resource.hosts:  # not the last attempt's hosts
            write_resource_config(attempt_ctx.job)
        self.attempt_ctx = attempt_ctx



class SoloSeat:
    """The seat of a job of one host (the single runner): no channel, no port, nothing to tell anyone.

    The agent runs the same phases and attempts on it, with no barrier (no other host to wait for).
    Kept here, so a single-host ``train`` imports no membership code (test/unit/test_launch_imports.py).
    """

    is_lead = True
    job_id = ""
    introductions: Mapping[str, Mapping[str, str]] = {}
    job_attempt = (0, False)

    def __init__(self, secret: bytes | None, hosts: Sequence[str], current: str, settings: object,
                 events: SimpleQueue, introduction: Mapping[str, str] | None = None):
        self.current = current
        self.hosts = tuple(hosts)

    def open(self) -> None:
        pass

    def barrier(self, attempt: int = 0, deadline_s: float | None = None) -> Attempt:
        return Attempt(attempt, self.hosts)

    def release(self, attempt: Attempt) -> None:
        pass

    def report_failure(self, reason: str, exit_code: int, at: float | None = None, attempt: int = 0,
                       stopped: bool = False) -> None:
        pass

    def report_done(self, exit_code: int) -> None:
        pass

    def fail(self, reason: str, exit_code: int, at: float | None = None) -> None:
        pass

    def announce(self, verdict: object, linger: bool = True) -> None:
        pass

    def restart(self, attempt: int, reason: str, cause: str | None = None) -> None:
        pass

    def progress(self, heartbeat: bool, checkpoint: bool = False) -> None:
        pass

    def share_mark(self, host: str, attempt: int) -> None:
        pass

    def request_stacks(self, timeout_s: float) -> Mapping[str, object]:
        return {}

    def send_stacks(self, stacks: list) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


def why_this_attempt(attempt: int, first_attempt: int, joined_running: bool = True) -> str:
    """Why the first attempt of this ``train`` is not 0: it rejoined a job that went on, the job's first lead was lost
    before its first attempt started (``meeting.lost_before_the_start``), or the platform restarted it."""
    if attempt > first_attempt:
        return "rejoining the job" if joined_running else "the lead was lost before the job started"
    return "the platform restarted the job" if attempt else ""
