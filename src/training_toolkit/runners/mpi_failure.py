"""mpirun's end in one line: the rank, its host and the cause; or mpirun's own reason, not its banner.

Open MPI writes its complaints as help blocks between rows of dashes, ends some
with "Type 'mpirun --help' for usage.", and wraps Open MPI 5's at ~76 columns.  The
line that says *why* is elsewhere: mpirun's "Error:" line (Open MPI 4: ``mpirun:
Error: unknown option "--NCCL_DEBUG=WARN"``), a program's own line outside the
blocks (ssh's first: ``ssh: Could not resolve hostname ...``; not Open MPI's own
``[host:pid] ... Warning`` lines), or the block's first paragraph
with its detail (Open MPI 5: "An unrecognized option was included on the mpirun
command line: Option: --NCCL_DEBUG=WARN").  Pure functions of the output's tail.

Every failure under MPI is mpirun's exit, on the lead; ``mpi_failure`` also gives the failing
rank's host as data (``MpiFailure.host``), so that the agent counts the failure against that host
(``roster.to_retire``), not against the lead that ran mpirun.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from training_toolkit.supervise.process import ExitStatus
from training_toolkit.core.records import record
from training_toolkit.job.report import Outcome
from training_toolkit.runspec import Blamed, Judge, Local

_TAGGED = re.compile(r"^\[\d+,(\d+)\]<(stderr|stdout)>:\s?(.*)$")
_ONLY_TAGS = re.compile(r"^(?:\s*\[\d+,\d+\]<(?:stderr|stdout)>:)*\s*$")  # Open MPI 5 flushes bare tags at the end
# mpirun's own reports.  Open MPI 5 (prterun) wraps them at about 76 columns, anywhere between
# words ("... exited on\nsignal 9 (Killed)."), and names a process [prterun-HOST-PID@1,RANK]
# where Open MPI 4 writes [[JOBID,1],RANK]: \s+ between words, both name forms.
_NOTICED = re.compile(r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+(\S+)\s+exited\s+on\s+signal\s+(\d+)")
_ABORT = re.compile(r"MPI_ABORT\s+was\s+invoked\s+on\s+rank\s+(\d+)")
_FIRST = re.compile(r"Process\s+name:\s*\[(?:\[\d+,\d+\]|[^\s\[\],]+@\d+),(\d+)\]")
_EXIT = re.compile(r"Exit\s+code:\s*(\d+)")
# mpirun lost one of its daemons ("node-died" in help-errmgr-base.txt, ORTE's and PRTE's): the job ends, incomplete
_LOST_DAEMON = re.compile(r"(?:ORTE|PRTE)\s+has\s+lost\s+communication\s+with\s+a\s+remote\s+daemon")
#: What the toolkit makes of Open MPI 5's exit code 0 after it lost a daemon: Open MPI 4's own code for that end.
LOST_DAEMON_EXIT = 205


def lost_a_daemon(tail: Sequence[str]) -> bool:
    """Whether mpirun said it lost a daemon and ended the job.

    Open MPI 5's prterun then exits 0 (measured, 5.0.11: a daemon killed, or an outsider's replayed
    daemon connect, and no rank had finished), where Open MPI 4's mpirun exits 205: an exit of 0 with
    this said is no success.
    """
    return bool(_LOST_DAEMON.search("\n".join(tail)))


@record
class MpiFailure:
    """mpirun's failed end: one line naming the rank, its host and the cause; and that host, as data."""

    line: str
    host: str | None = None  # the failing rank's host, one of the attempt's; None: no rank named (mpirun's own end)


def describe_mpi_failure(tail: Sequence[str], hosts: Sequence[str], per_host: int, status: ExitStatus) -> str:
    """One line naming the rank, its host and the cause, from mpirun's own report and the ranks' stderr."""
    return mpi_failure(tail, hosts, per_host, status).line


def mpi_failure(tail: Sequence[str], hosts: Sequence[str], per_host: int, status: ExitStatus) -> MpiFailure:
    """The line (``describe_mpi_failure``) and the failing rank's host: the node mpirun named, if it is one of
    ``hosts`` (the attempt's, in rank order), else the rank's by its slot (``per_host`` ranks to a host, in order)."""
    text = "\n".join(tail)
    rank: int | None = None
    named: str | None = None
    cause: str | None = None
    if match := _NOTICED.search(text):
        rank, named = int(match.group(1)), match.group(2)
        signum = int(match.group(3))
        cause = ExitStatus(-signum).describe()
    elif match := _ABORT.search(text):
        rank = int(match.group(1))
        cause = "called MPI_Abort"
    elif match := _FIRST.search(text):
        rank = int(match.group(1))
        code = _EXIT.search(text)
        cause = f"exited with code {code.group(1)}" if code else "exited with a non-zero code"
    last_error = _last_rank_error(tail, rank)
    if rank is None:
        said = mpirun_reason(tail)
        description = f"{hosts[0]}: mpirun " + ("lost a daemon and ended the job" if lost_a_daemon(tail) else status.describe())
        return MpiFailure(f"{description}: {said}"[:900] if said else description)
    by_slot = hosts[rank // per_host] if per_host and rank // per_host < len(hosts) else None
    host = named if named in hosts else by_slot
    line = f"rank {rank} on {named or by_slot or '?'} {cause}"
    return MpiFailure(f"{line}: {last_error}"[:900] if last_error else line, host)


def _last_rank_error(tail: Sequence[str], rank: int | None) -> str | None:
    for line in reversed(tail):
        match = _TAGGED.match(line)
        if match and match.group(2) == "stderr" and not _ONLY_TAGS.match(match.group(3)):
            if rank is None or int(match.group(1)) == rank:
                return match.group(3).strip()
    return None


_ERROR_LINE = re.compile(r"^\s*(?:mpirun|mpiexec|orterun|prterun|prte)\S*:\s*Error\b.*", re.IGNORECASE)
_BANNER = re.compile(r"^\s*-{10,}\s*$")
_USAGE_HINT = re.compile(r"^\s*Type '\S+ --help'")
_OWN_DIAGNOSTIC = re.compile(r"^\s*\[[^\]\s]+:\d+\]")  # "[algo-1:00020] plm:ssh: Warning: setpgid(...) failed"
_AGENT = re.compile(r"^\s*(?:ssh|training-toolkit-ssh):")  # the rsh agent's own words (ssh's, or ours: native/ssh_agent.c)


def mpirun_reason(tail: Sequence[str]) -> str | None:
    """The line of mpirun's output that says why it failed; None when it said nothing but rank output."""
    lines = [line for line in tail if not _TAGGED.match(line) and not (line.strip() and _ONLY_TAGS.match(line))]
    for line in lines:
        if _ERROR_LINE.match(line):
            return line.strip()
    outside: list[str] = []
    blocks: list[list[str]] = []
    inside = False
    for line in lines:
        if _BANNER.match(line):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside:
            blocks[-1].append(line)
        elif line.strip() and not _USAGE_HINT.match(line):
            outside.append(line.strip())
    said = [line for line in outside if not _OWN_DIAGNOSTIC.match(line)]
    agent = [line for line in said if _AGENT.match(line)]
    if agent or said:
        return (agent or said)[-1]
    for block in blocks:
        if said := _first_paragraphs(block):
            return said
    return None


def _first_paragraphs(block: Sequence[str]) -> str:
    """A help block's first paragraph, one line; with the next one too when the first ends with a colon."""
    paragraphs: list[list[str]] = [[]]
    for line in block:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    text = " ".join(paragraphs[0])
    if text.endswith(":") and len(paragraphs) > 1 and paragraphs[1]:
        text = f"{text} {' '.join(paragraphs[1])}"
    return text


def mpirun_judge(hosts: Sequence[str], per_host: int) -> Judge:
    """How mpirun's end is told, for an attempt over ``hosts`` (in rank order, ``per_host`` ranks each): a failure
    blamed on the failing rank's host (``mpi_failure``; None: mpirun's own end, the lead's); an exit 0 after it
    lost a daemon is a failure too (``lost_a_daemon``), with Open MPI 4's code for that end."""

    def judged(local: Local, status: ExitStatus) -> Blamed | None:
        local.child.drain()
        tail = tuple(local.child.tail.lines(100))
        if status.ok:
            if not lost_a_daemon(tail):
                return None
            status = ExitStatus(LOST_DAEMON_EXIT)
        failed = mpi_failure(tail, hosts, per_host, status)
        return Blamed(Outcome(status.exit_code, failed.line, tuple(local.child.argv), tail), failed.host)

    return judged
