"""Meeting the job, the loop's host's part: an attempt's barrier (the lead's, a follower's, after a lost lead the
next one's), and the roles that change on the way (a follower that takes the lead, a lead back after its loss).

The lead runs the loop's step on the channel's events until every host is
ready (``Release``), then chooses the attempt (``Seats.choose``) and sends the
go; a follower says it is ready and waits for the go (``Membership.barrier``).

Failover: the rule is ``succession``'s (pure); the decision that the job fails over
is the step's (``follow.py``: ``FailOver`` once this host's part stopped).  Here the
loop's host tries each successor in the platform's order: it joins the first
that answers as the lead of the next attempt, or leads itself when its own
turn comes (``HostAgent.take_lead``): its first barrier then waits for every
member left and passes at its deadline only with a majority of them.  Each
wait is as long as the slowest survivor may take to hear of the loss (the peer
timeout) and stop its part (the grace and its margin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from training_toolkit.agent.actions import Ended, carry_out
from training_toolkit.agent.events import BarrierOpened, FailOver, PeerLost, Release
from training_toolkit.agent.state import STOP_MARGIN_S, follower_state, promoted, stop_wait
from training_toolkit.agent.decisions import attempt_to_join, toward
from training_toolkit.agent.succession import has_majority, successors, term, waits
from training_toolkit.core.errors import EXIT_NO_MAJORITY, ClusterError, Interrupted, LeadLost, NoMajority
from training_toolkit.job.attempt import seated
from training_toolkit.core.log import log
from training_toolkit.job.report import Outcome
from training_toolkit.supervise.process import STOPPING_SIGNALS, SignalForwarder

if TYPE_CHECKING:
    from training_toolkit.job.attempt import Attempt

# ``agent`` below is the loop's ``HostAgent`` (not imported: the loop imports this module)


def may_fail_over(agent) -> bool:
    """Should this attempt's lead be lost, may the job go on under a new one?  Only if it may go on with fewer
    hosts (spares, or a minimum) and the members left are a majority."""
    return not agent.is_lead and agent.seats.followers_may_lead()


def first_barrier(agent) -> Attempt:
    """This ``train``'s first barrier.  Should the lead be lost there, where the job may fail over at all (spares or a
    minimum): a member of the job's first barrier fails over as for a lead lost
    while its first attempt runs (``lost_before_the_start``); a host that came back into a running job, waiting there
    as a spare until a restart seats it, follows the next lead (``follow_next_lead``)."""
    while True:
        try:
            return barrier(agent, agent.seats.first_deadline(agent.attempt, agent.state.first_attempt))
        except LeadLost as lost:
            agent.check_stop()  # a stop that came meanwhile (it ended the wait): stopped, never a failover
            seats = agent.seats
            if agent.is_lead or not seats.elastic:
                raise
            _, running = agent.membership.job_attempt
            if not running and seats.followers_may_lead():
                return lost_before_the_start(agent, lost.lead, str(lost))
            if agent.attempt <= agent.state.first_attempt:
                raise
            follow_next_lead(agent, lost.lead)


def lost_before_the_start(agent, lost: str, reason: str) -> Attempt:
    """The lead ``lost`` at the job's first barrier, before its go reached this host.  Its go may have reached others:
    they run the first attempt, the first roster (``Seats.first_choice``, which every host computes alike), and fail
    over from it when they hear the loss.  So this host takes that attempt as the last and fails over from it too, to
    the same next attempt under the same next lead (``next_lead``): a restart, as for any lead's loss."""
    seats, first = agent.seats, agent.attempt
    seats.take_first_choice()
    # the record: that attempt, never started here, its lead's loss its fault, and the failover its restart
    agent.recorder.seated(seats.attempt)
    agent.recorder.step(PeerLost(lost, reason), (FailOver(first + 1, reason, lost),), first)
    _toward(agent, first + 1, lost)
    log(f"{agent.host}: {lost} was lost before attempt {first + 1} started here (its go may have reached others): "
        f"the members fail over to attempt {first + 2}")
    return next_lead(agent, lost)


def follow_next_lead(agent, lost: str) -> None:
    """A host back in a running job, waiting for its first seat, its lead ``lost``: join the next lead, the first
    host in the platform's order that answers as the lead of the attempt it waits for.  It was no member of the last
    attempt (it knows none of them), so it never leads; the new lead's first barrier seats it where the job needs it
    (``barrier.Barrier.needed``).  Each candidate is given the waits it may take to lead (``succession.waits``, every
    host of the job counted as a member: this host knows no better)."""
    wait_s = _failover_wait_s(agent)
    _introduce(agent)
    for candidate in successors(agent.hosts, agent.hosts, (lost, agent.host)):
        agent.check_stop()
        if _follows(agent, candidate, waits(agent.hosts, agent.hosts, lost, candidate) * wait_s):
            log(f"{agent.host}: following {candidate}, the lead after {lost}, as a spare for attempt {agent.attempt + 1}")
            return
    raise NoMajority(f"{agent.host}: no host leads the job after {lost} was lost; this host may be the one cut off "
                     f"from the others, so it stops")


def restart_barrier(agent) -> Attempt:
    """A restart's barrier (a host may still be giving its ranks their grace: that is not a host that did not come
    back).  A follower whose lead is lost while it waits for the go meets the next lead instead, for the same
    attempt, if the job may fail over (``follow._fails_over``'s rule: set at the last attempt's start)."""
    try:
        return barrier(agent, agent.ctx.settings.join_timeout_s + agent.ctx.grace_s, alive_only=agent.elastic)
    except LeadLost as lost:
        agent.check_stop()  # a stop that came meanwhile (it ended the wait): stopped, never a failover
        if agent.is_lead or not agent.state.failover or agent.state.stop_signal is not None:
            raise
        return next_lead(agent, lost.lead)


def next_lead(agent, lost: str) -> Attempt:
    """The barrier of the agent's (new) attempt under the next lead after ``lost``: the ``Attempt`` it starts.  A
    next lead lost in turn before its go (during its first barrier) is passed over as one that never answered: the
    members after it are tried, this host's own turn included, while a majority of the members is left, each for its
    own attempt (``succession.term``: the lost one's go may have started its attempt on other hosts)."""
    assert agent.membership is not None
    gone, first = [lost], agent.attempt
    _introduce(agent)
    while True:
        try:
            return _under_next_lead(agent, lost, gone, first)
        except _LostBeforeItsGo as again:
            agent.check_stop()  # a stop that came meanwhile (it ended the wait): stopped, never a failover
            log(f"{agent.host}: {again.lead} was lost too, before attempt {agent.attempt + 1} started here (its go may "
                f"have reached others): the next member leads the attempt after it")
            gone.append(again.lead)


class _LostBeforeItsGo(Exception):
    def __init__(self, lead: str):
        super().__init__(lead)
        self.lead = lead


def _under_next_lead(agent, lost: str, gone: list[str], first: int) -> Attempt:
    """One search for the next lead after ``lost``, skipping the members ``gone`` (``lost`` and any next lead lost
    before its go): the first that answers as the lead of its attempt (``succession.term``: ``first`` for the first
    successor, one more for each after it), or this host at its own turn."""
    members, wait_s = agent.seats.members, _failover_wait_s(agent)
    for candidate in successors(agent.hosts, members, gone):
        agent.check_stop()  # a stop between candidates ends the search (``Stopped``)
        waited = waits(agent.hosts, members, lost, candidate) * wait_s
        _toward(agent, term(agent.hosts, members, lost, candidate, first), lost)
        if candidate == agent.host:
            log(f"{agent.host}: leading the job from attempt {agent.attempt + 1} ({', '.join(gone)} lost)")
            take_lead(agent, lost)
            expected = tuple(host for host in members if host not in (*gone, agent.host))
            return barrier(agent, waited, members=members, expected=expected, needed=agent.seats.min_hosts)
        if _follows(agent, candidate, waited):
            log(f"{agent.host}: following {candidate}, the lead of attempt {agent.attempt + 1} ({', '.join(gone)} lost)")
            try:
                return agent.membership.barrier(agent.attempt, waited)
            except LeadLost:
                left = successors(agent.hosts, members, (*gone, candidate))
                if not has_majority(left, members):  # no lead could gather one: the job ends, named
                    raise NoMajority(f"{agent.host}: no majority to lead the job: {len(left)} of its {len(members)} "
                                     f"members left after losing {', '.join((*gone, candidate))}") from None
                raise _LostBeforeItsGo(candidate) from None
    # no member left to lead (this host is not one: a spare the lost lead retired, say): it may be the one cut off
    raise NoMajority(f"no member of {', '.join(members)} leads the job after {', '.join(gone)} was lost; this host may "
                     f"be the one cut off from the others, so it stops")


def _toward(agent, number: int, lost: str) -> None:
    """The agent on its way to attempt ``number`` (``decisions.toward``), if a restart is left for it."""
    if number - agent.state.first_attempt > agent.state.max_restarts:
        raise ClusterError(f"{agent.host}: no restart left to lead the job on after {lost} was lost (attempt "
                           f"{number + 1}, past the {agent.state.max_restarts} restarts allowed)")
    agent.state = toward(agent.state, number)


def _introduce(agent) -> None:
    """Before this host looks for the next lead (to join it, or to become it): it tells what it learnt since it joined
    (``Membership.introduce``), once for the search.  A host that could not take part never gets here: its setup's
    failure ended the job."""
    agent.membership.introduce(agent.introduction())


def _failover_wait_s(agent) -> float:
    """How long a survivor waits for the next lead: the slowest survivor hears of the loss (the peer timeout) and
    stops its part (the grace and its margin)."""
    return agent.ctx.settings.peer_timeout_s + agent.ctx.grace_s + STOP_MARGIN_S


def _follows(agent, candidate: str, wait_s: float | None = None) -> bool:
    """Whether ``candidate`` answered as the lead of the agent's attempt or a newer one (its seat now follows it, and
    the agent is on its way to the lead's attempt); a stop that ended the join ends the search (``Stopped``)."""
    assert agent.membership is not None
    try:
        agent.membership.follow(candidate, agent.attempt, _failover_wait_s(agent) if wait_s is None else wait_s)
    except Interrupted:
        agent.check_stop()  # the stop that ended the join
        raise
    except ClusterError as exc:
        log(f"{agent.host}: {candidate} does not lead the job: {exc}")
        return False
    # a lead at a newer attempt than this host asked for (it counted more members before it, or went on): this host is
    # ready for that one, which the lead's barrier waits for
    agent.state = toward(agent.state, attempt_to_join(*agent.membership.job_attempt))
    return True


def barrier(agent, deadline_s: float | None, alive_only: bool = False, members: tuple[str, ...] = (),
            expected: tuple[str, ...] | None = None, needed: int = 0) -> Attempt:
    """Every host ready for this attempt: the ``Attempt``, the same on every host.  A host other than the lead
    says it is ready and waits for the go.  The lead runs the loop: the channel's events and Ticks go to the
    step until every host is ready (``Release``: it chooses the attempt's hosts, sends the go) or the job ends
    (``Ended``).  ``expected``: the hosts it waits for (None: every other host of the job); ``members``: a new
    lead's, passed at the deadline with a majority of them, waiting until then for ``needed`` hosts, the job's minimum
    (``barrier.Barrier``)."""
    assert agent.membership is not None
    if agent.spec.solo:  # no other host: nothing to wait for, nothing to tell
        return seated(agent.attempt, agent.hosts)
    if not agent.is_lead:
        return agent.membership.barrier(agent.attempt, deadline_s)
    deadline_s = agent.ctx.settings.join_timeout_s if deadline_s is None else deadline_s
    agent.in_barrier = True
    try:
        others = expected if expected is not None else tuple(host for host in agent.hosts if host != agent.host)
        actions = agent.step_held(BarrierOpened(others, deadline_s, alive_only, members, needed))
        while not any(isinstance(action, Release) for action in actions):
            outcome = carry_out(agent, actions)
            if outcome is not None:
                raise Ended(outcome)
            actions = agent.step_held(agent.next_event())
    finally:
        agent.in_barrier = False
    release = next(action for action in actions if isinstance(action, Release))
    attempt = agent.seats.choose(agent.attempt, agent.attempt == agent.state.first_attempt, release,
                                agent.state.cause_hosts)
    agent.membership.release(attempt)
    return attempt


def take_lead(agent, lost: str) -> None:
    """The agent's host leads from its (new) attempt on, its lead ``lost``: its seat serves the channel, its state
    keeps what a lead keeps (``decisions.promoted``), its seats the lost lead's seat (``Seats.take_lead``)."""
    assert agent.membership is not None
    agent.membership.take_lead(agent.attempt)
    agent.seats.take_lead(lost)
    agent.is_lead = True
    agent.state = promoted(agent.state, [host for host in agent.hosts if host != agent.host],
                           agent.spec.wait_for_peers, agent.watch)


def follow_the_running_job(agent) -> None:
    """The platform's first host, back after its loss, found the job running under another lead (its seat follows
    it, ``Membership._join_a_running_job``): it is a follower, joining at the next restart, a spare until then."""
    config = agent.ctx.settings
    agent.is_lead = agent.seats.is_lead = False
    agent.state = follower_state(agent.host, config.max_restarts, agent.ctx.first_attempt, stop_wait(agent.ctx.grace_s))
    attempt, _ = agent.membership.job_attempt
    log(f"{agent.host}: the job runs without this host (attempt {attempt + 1}, under another lead): joining it as a "
        f"spare")


def back_into_the_job(agent, outcome: Outcome, again: Callable[[], Any]) -> Outcome:
    """``agent``'s host left the job with no majority, every process of its part ended: it looks for a host that leads
    the job, for ``rejoin_wait_s`` (it may be the one cut off, and the cut may mend), and takes part again as a host
    back after its loss does, in a new agent (``again``, sharing the record): a spare until a restart seats it, or
    the job's verdict.  It never leads a job of its own.  None found, or a stop meanwhile: ``outcome``, as it was
    (and any other outcome: ``outcome``)."""
    import threading

    window_s = agent.ctx.settings.rejoin_wait_s
    if outcome.exit_code != EXIT_NO_MAJORITY or agent.spec.solo or window_s <= 0:
        return outcome
    log(f"{agent.host}: looking for the job under another lead for {window_s:g} s, to join it as a spare should this "
        f"host be the one cut off and the cut mend; it left the job with {outcome.exit_code}: {outcome.reason}")
    back, stopped = again(), threading.Event()
    with SignalForwarder(lambda signum: stopped.set() if signum in STOPPING_SIGNALS else None):
        back.membership = back.new_seat(agent.introduction(), looking=True)
        found = back.membership.look(window_s, stopped)
    if not found:
        back.membership.close()
        log(f"{agent.host}: " + ("stopped while looking for the job" if stopped.is_set() else
                                 f"no host leads the job after {window_s:g} s of looking") +
            f": leaving with {outcome.exit_code}")
        return outcome
    return back.run_job()
