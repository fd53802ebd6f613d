"""The listener guard on real processes and a real network (namespaces): what it filters, what it cuts, what it leaves.

Host ``a`` runs a fake Open MPI daemon (a process named ``orted``) and its
"rank" (test/fixtures/scripts/guarded_host.py); ``b`` is a host of the job;
``c`` an outsider, which holds a connection to the daemon before the guard
starts, as one that raced it would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers.paths import FIXTURES
from training_toolkit.local.netns import NamespaceCluster

pytestmark = [pytest.mark.root]

CONNECT = """
import socket, sys, time
s = socket.socket(); s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
except OSError as exc:
    print("failed", exc.__class__.__name__, flush=True); sys.exit()
print("connected", flush=True)
if sys.argv[4] == "hold":
    s.sendall(b"x")
    t0 = time.monotonic()
    try:
        data = s.recv(10)
        print("closed" if not data else "data", round(time.monotonic() - t0, 2), flush=True)
    except socket.timeout:
        print("held", flush=True)  # nobody cut it within the timeout
    except OSError as exc:
        print("closed", exc.__class__.__name__, flush=True)
"""


def test_the_guard_filters_the_daemon_and_the_ranks_btl_and_cuts_an_outsider_that_raced_it():
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)}
    with tempfile.TemporaryDirectory(prefix="guard-") as tmp, NamespaceCluster(["a", "b", "c"], Path(tmp)) as cluster:
        work = Path(tmp) / "work"
        work.mkdir()
        a, b = cluster.host("a").address, cluster.host("b").address
        host = cluster.popen("a", [sys.executable, str(FIXTURES / "guarded_host.py"), str(work), b], env=env,
                             stdout=subprocess.PIPE, text=True)
        try:
            assert host.stdout.readline().strip() == "ready"

            def client(name, port, mode="once", timeout=2.0):
                return cluster.popen(name, [sys.executable, "-c", CONNECT, a, str(port), str(timeout), mode], env=env,
                                     stdout=subprocess.PIPE, text=True)

            raced = client("c", 7777, "hold", timeout=15)
            assert raced.stdout.readline().strip() == "connected"  # before the guard: anyone gets in
            time.sleep(0.3)
            started = time.monotonic()
            (work / "go").touch()
            line = raced.stdout.readline().strip()
            assert line.startswith("closed"), line  # cut: the daemon's blocking read returned
            assert time.monotonic() - started < 5
            time.sleep(0.3)  # the guard's first sweeps are done
            outcomes = {(name, port): client(name, port).communicate(timeout=30)[0].split()[0]
                        for name in "bc" for port in (7777, 31000, 8080)}
            assert outcomes == {("b", 7777): "connected", ("b", 31000): "connected", ("b", 8080): "connected",
                                ("c", 7777): "failed", ("c", 31000): "failed", ("c", 8080): "connected"}
            local = cluster.run("a", [sys.executable, "-c", CONNECT, "127.0.0.1", "7777", "2", "once"], env=env,
                                timeout=30, capture_output=True, text=True).stdout
            assert local.split()[0] == "connected"  # loopback: the host itself
        finally:
            (work / "stop").touch()
            out = host.communicate(timeout=30)[0]
        assert "filtered 2" in out, out  # the daemon's listener and the rank's at 31000, not its 8080
        said = [line for line in out.splitlines() if line.startswith("said: ")]
        assert said == [f"said: listener guard: cut a connection from {cluster.host('c').address} to port 7777 of orted "
                        "(not a host of the job)"], out


def test_where_filters_are_refused_the_guard_cuts_every_outsider_connection_it_sees():
    """As in a container without CAP_NET_ADMIN: outsiders connect, and are cut within a look or two."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)}
    with tempfile.TemporaryDirectory(prefix="guard-") as tmp, NamespaceCluster(["a", "b", "c"], Path(tmp)) as cluster:
        work = Path(tmp) / "work"
        work.mkdir()
        a, b = cluster.host("a").address, cluster.host("b").address
        host = cluster.popen("a", [sys.executable, str(FIXTURES / "guarded_host.py"), str(work), b, "no-filters"],
                             env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert host.stdout.readline().strip() == "ready"
            (work / "go").touch()
            time.sleep(0.5)  # the guard has seen the listeners

            def hold(name, port):
                return cluster.popen(name, [sys.executable, "-c", CONNECT, a, str(port), "4", "hold"], env=env,
                                     stdout=subprocess.PIPE, text=True)

            held = {(name, port): hold(name, port) for name in "bc" for port in (7777, 31000, 8080)}
            # each prints "connected", then "held" (nobody cut it within 4 s) or "closed"
            outcomes = {key: proc.communicate(timeout=30)[0].split()[1] for key, proc in held.items()}
        finally:
            (work / "stop").touch()
            out = host.communicate(timeout=30)[0]
        assert outcomes == {("b", 7777): "held", ("b", 31000): "held", ("b", 8080): "held",
                            ("c", 7777): "closed", ("c", 31000): "closed", ("c", 8080): "held"}, (outcomes, out)
        said = [line for line in out.splitlines() if line.startswith("said: ")]
        assert said[0].startswith("said: listener guard: cannot attach a socket filter"), out
        cuts = [line for line in said if line.startswith("said: listener guard: cut a connection from ")]
        assert len(cuts) == 1 and f"from {cluster.host('c').address} to port " in cuts[0], out  # once per address
        assert "filtered 0" in out, out
