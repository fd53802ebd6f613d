"""The process table as /proc shows it, checked against processes started here."""

from __future__ import annotations

import pytest
import os
import signal
import subprocess
import time

from training_toolkit.supervise import procfs

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)


def test_a_process_tree_its_group_and_its_environment():
    marker = f"PROCFS_TEST={os.getpid()}"
    name, value = marker.split("=")
    tree = subprocess.Popen(["/bin/sh", "-c", "sleep 100 & sleep 100 & echo ready; wait"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, name: value})
    try:
        assert tree.stdout.readline() == "ready\n"
        below = procfs.descendants(tree.pid)
        assert len(below) == 2
        assert {p.ppid for p in below} == {tree.pid}
        assert {p.pgid for p in below} == {tree.pid}
        assert not any(p.zombie for p in below)
        me = procfs.read(os.getpid())
        assert me is not None and me.pid == os.getpid() and me.ppid == os.getppid() and not me.zombie
        assert tree.pid in [p.pid for p in procfs.descendants(os.getpid())]
        assert set(procfs.marked_descendants(os.getpid(), marker.encode())) == {tree.pid} | {p.pid for p in below}
        assert set(procfs.marked_descendants(os.getpid(), marker.encode(), exclude=frozenset({tree.pid}))) == \
            {p.pid for p in below}
        # anywhere in the PID namespace (a job's processes under another parent: Slurm's step daemon)
        assert set(procfs.marked(marker.encode())) == {tree.pid} | {p.pid for p in below}
        assert set(procfs.marked(marker.encode(), exclude=frozenset({tree.pid}))) == {p.pid for p in below}
        # the same tree through the children files, parents first
        assert sorted(procfs.tree(tree.pid)) == sorted(p.pid for p in below)
        mine = procfs.tree(os.getpid())
        assert mine.index(tree.pid) < min(mine.index(p.pid) for p in below)
        assert procfs.tree(2**22 + 1) == []  # no such process
        assert not procfs.has_marker(os.getpid(), marker.encode())
        sleeper = below[0].pid
        deadline = time.monotonic() + 5
        while procfs.comm(sleeper) != "sleep":  # the forked shell execs sleep in its own time
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert procfs.comm(sleeper) == "sleep"
        assert procfs.cmdline(sleeper) == "sleep 100"
        assert procfs.describe(sleeper) == f"{sleeper} sleep"
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()


def test_descendants_through_the_children_files_are_the_snapshots_and_a_kernel_without_them_scans(monkeypatch):
    tree = subprocess.Popen(["/bin/sh", "-c", "sh -c 'sleep 100 & wait' & sleep 100 & echo ready; wait"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert tree.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 5
        while len(procfs.descendants(tree.pid, procfs.snapshot())) < 3:  # the inner shell forks in its own time
            assert time.monotonic() < deadline
            time.sleep(0.01)
        walked = procfs.descendants(tree.pid)
        assert sorted(walked) == sorted(procfs.descendants(tree.pid, procfs.snapshot()))
        assert len(walked) == 3 and {p.ppid for p in walked} - {p.pid for p in walked} == {tree.pid}
        order = [p.pid for p in walked]
        assert all(order.index(p.ppid) < order.index(p.pid) for p in walked if p.ppid != tree.pid)  # parents first
        leaf = next(p.pid for p in walked if p.pid not in {q.ppid for q in walked})
        assert procfs.has_children(tree.pid) and not procfs.has_children(leaf)
        scans = []
        monkeypatch.setattr(procfs, "_has_children_files", lambda: False)
        monkeypatch.setattr(procfs, "snapshot", lambda real=procfs.snapshot: scans.append(1) or real())
        assert sorted(procfs.descendants(tree.pid)) == sorted(walked) and scans == [1]
        assert procfs.has_children(leaf)  # it cannot tell: the caller scans
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()


def test_a_zombie_is_not_alive_and_a_reaped_process_is_gone():
    proc = subprocess.Popen(["/bin/true"])
    deadline = time.monotonic() + 5
    while not procfs.read(proc.pid).zombie:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not procfs.alive(proc.pid)
    assert procfs.netns_of(proc.pid) is None  # an exited process has no namespaces left
    proc.wait()
    assert procfs.read(proc.pid) is None
    assert procfs.comm(proc.pid) == "?" and procfs.cmdline(proc.pid) is None


def test_processes_are_found_by_network_namespace():
    own = procfs.netns_of("self")
    assert own is not None and own == procfs.netns_of(os.getpid()) == procfs.namespace_id("/proc/self/ns/net")
    assert os.getpid() in procfs.in_network_namespaces({own})
    assert procfs.in_network_namespaces({own})[os.getpid()] == own
    assert procfs.in_network_namespaces(set()) == {}
    assert procfs.namespace_id("/nonexistent") is None


def test_a_process_caught_in_the_middle_of_exec_still_shows_its_marker():
    # execve empties /proc/PID/environ for a moment (the new image's is not laid out yet); a
    # reader that catches it there must not take the process for one without the marker, or a
    # stop routine that looks for marked processes misses it.  The child execs twice (sh, then
    # sleep), with the marker from the first; every read once it runs sh must find the marker.
    misses = reads = 0
    for _ in range(30):
        pid = os.fork()
        if pid == 0:
            os.execve("/bin/sh", ["sh", "-c", "exec /bin/sleep 30"], {"PROCFS_EXEC": "yes"})  # killed below
        try:
            deadline = time.monotonic() + 5
            while procfs.comm(pid) not in ("sh", "sleep"):
                assert time.monotonic() < deadline
            while procfs.comm(pid) == "sh" or reads % 20:
                reads += 1
                misses += not procfs.has_marker(pid, b"PROCFS_EXEC=yes")
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert reads >= 30 and misses == 0


def test_an_empty_environment_is_no_marker_and_costs_a_bounded_wait():
    proc = subprocess.Popen(["/bin/sleep", "10"], env={})
    try:
        began = time.monotonic()
        assert not procfs.has_marker(proc.pid, b"X=1")
        assert time.monotonic() - began < procfs.EXEC_WINDOW_S + 1
    finally:
        proc.kill()
        proc.wait()


def test_an_identity_names_one_process_for_good_and_only_where_its_pid_means_it():
    proc = subprocess.Popen(["/bin/sleep", "10"])
    try:
        ident = procfs.identity(proc.pid)
        assert ident is not None and procfs.identity_alive(ident) is True
        boot, pidns, pid, start = ident.split(":")
        assert int(pid) == proc.pid and procfs.identity() != ident
        assert procfs.identity_alive(f"{boot}:{pidns}:{pid}:{int(start) + 1}") is False  # the pid, reused
        assert procfs.identity_alive(f"{boot}:1:{pid}:{start}") is None  # another PID namespace's pid
        assert procfs.identity_alive(f"another-boot:{pidns}:{pid}:{start}") is None
    finally:
        proc.kill()
        proc.wait()
    assert procfs.identity_alive(ident) is False and procfs.identity(proc.pid) is None
