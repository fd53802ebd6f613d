"""`training-toolkit local` killed with SIGKILL, as a CI job's timeout does it: nothing of the job survives.

The job is the one users hit: a 2-host x 2-rank MPI job whose rank 3 hangs in its own code while
the others spin in ``allreduce``, every rank ignoring SIGTERM.  ``local`` runs in its own process
group and the whole group gets SIGKILL: ``local`` itself, nobody else.  Whatever ran below it
(hosts' inits, train, sshd and its sessions, mpirun, orted, the ranks) must be gone within a
bound, with nothing of the cluster left: no process in its network namespaces, no process
holding it, no mount, no link in the machine's namespace.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.jobs import clean_env, toolkit_cmd
from training_toolkit.supervise import procfs
from training_toolkit.local import teardown
from training_toolkit.local.holders import MARKER

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd, pytest.mark.whole_machine]  # the root links

HANG = """
import os, signal, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop takes its whole grace period
for step in range(1000000):
    if rank == 3 and step == 3:
        time.sleep(100000)
    comm.allreduce(rank)
    if rank == 0:
        print(f"step {step}", flush=True)
        time.sleep(0.2)
"""

#: Seconds after the SIGKILL by which every process of the job must be gone.
BOUND_S = 10


def start_local(tmp_path: Path) -> subprocess.Popen[str]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "hang.py").write_text(HANG)
    return subprocess.Popen(
        toolkit_cmd() + ["local", "--hosts", "2", "--source", str(src), "--entry-point", "hang.py",
                         "--distribution", "mpi", "--processes-per-host", "2", "--workdir", str(tmp_path / "work"),
                         "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), start_new_session=True)


def wait_for_output(proc: subprocess.Popen[str], wanted: str, timeout: float) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if wanted in line:
                return seen
    raise AssertionError(f"no {wanted!r} within {timeout} s; output:\n{''.join(seen)}")


def wait_for_process(local: subprocess.Popen[str], name: str, timeout: float, count: int = 1) -> None:
    """Until ``count`` processes below ``local`` run ``name`` (every host's ``train``, say)."""
    deadline = time.monotonic() + timeout
    while sum(name in (procfs.cmdline(p.pid) or "") for p in procfs.descendants(local.pid)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} {name} below local within {timeout} s"
        time.sleep(0.005)


class Job:
    """What runs below ``local`` now, held by pidfds (a reused pid is never mistaken for it)."""

    def __init__(self, local: subprocess.Popen[str]) -> None:
        self.pidfds: dict[int, int] = {}
        self.namespaces: set[procfs.NamespaceId] = set()
        self.tags: set[str] = set()
        for proc in procfs.descendants(local.pid):
            try:
                self.pidfds[proc.pid] = os.pidfd_open(proc.pid)
            except ProcessLookupError:
                continue
            ident = procfs.netns_of(proc.pid)
            if ident is not None and ident != procfs.netns_of("self"):
                self.namespaces.add(ident)
            self.tags |= {entry.split("=", 1)[1] for entry in _environ(proc.pid) if entry.startswith(MARKER + "=")}
        # what runs in the hosts without descending from local (sshd's sessions, daemons)
        self.namespaces_pids = set(procfs.in_network_namespaces(self.namespaces))

    def running(self) -> list[str]:
        left = [procfs.describe(pid) for pid, fd in self.pidfds.items() if not select.select([fd], [], [], 0)[0]]
        left += [procfs.describe(pid) for pid in procfs.in_network_namespaces(self.namespaces)]
        left += [line for tag in self.tags for line in teardown.leftovers(tag)]
        return left

    def close(self) -> None:
        for fd in self.pidfds.values():
            os.close(fd)


def _environ(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def kill_and_check(local: subprocess.Popen[str], tmp_path: Path, links_before: list[str], *, hosts: int) -> None:
    job = Job(local)
    try:
        try:
            assert len(job.tags) == 1 and len(job.namespaces) >= hosts, (job.tags, job.namespaces)
        finally:
            os.killpg(local.pid, signal.SIGKILL)  # the job never outlives the test, even when the look was short
        local.wait(timeout=10)
        began = time.monotonic()
        while left := job.running():
            assert time.monotonic() - began < BOUND_S, f"alive {BOUND_S} s after local was killed: {left}"
            time.sleep(0.02)
        print(f"\nthe job's last process gone {time.monotonic() - began:.3f} s after local; "
              f"{len(job.pidfds)} processes below local, {len(job.namespaces_pids)} in its hosts")
    finally:
        job.close()
        if local.stdout is not None:
            local.stdout.close()
    assert teardown.mounts_under(tmp_path / "work") == []
    assert _root_links() == links_before
    assert not [n for n in os.listdir("/run/netns") if n.startswith(tuple(job.tags))] \
        if os.path.isdir("/run/netns") else True


def test_killed_during_the_join(tmp_path: Path) -> None:
    links = _root_links()
    with_local(tmp_path, links, lambda local: wait_for_process(local, "/train", 60, count=2))  # every host's train
    #                                                                   has just started: joining, keys, sshd


def test_killed_while_the_ranks_run(tmp_path: Path) -> None:
    links = _root_links()
    with_local(tmp_path, links, lambda local: wait_for_output(local, "step 2", 120))  # rank 3 hangs from step 3 on;
    #                                                                                  the others spin in allreduce


def with_local(tmp_path: Path, links: list[str], until) -> None:
    """``local`` started, ``until(local)`` waited for, then killed and checked; killed in any case."""
    local = start_local(tmp_path)
    try:
        until(local)
    except BaseException:
        os.killpg(local.pid, signal.SIGKILL)
        local.wait(timeout=30)
        raise
    kill_and_check(local, tmp_path, links, hosts=2)


def test_killed_while_it_stops_the_job(tmp_path: Path) -> None:
    links = _root_links()

    def stopping(local: subprocess.Popen[str]) -> None:
        wait_for_output(local, "step 2", 120)
        local.send_signal(signal.SIGTERM)  # local passes it to every host's train: the stop has begun,
        time.sleep(1)  # and the ranks, which ignore SIGTERM, hold it (local gives the hosts 10 s)
        assert local.poll() is None

    with_local(tmp_path, links, stopping)
