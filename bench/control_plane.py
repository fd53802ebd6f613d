"""The control plane at N hosts (1,000 by default): the real first-host server against N real joining clients.

The first host of a job serves every join, every heartbeat and the verdict to every host (a star).
This runs that server (``cluster.server.ControlServer`` with its default admission: no secret, seats
by address, names resolved by ``getaddrinfo``) in this process, and N-1 real ``ControlClient``s as
threads in 8 worker processes, each joining from its own loopback address (127.10.x.y); the
names ``algo-1`` .. ``algo-N`` resolve to those addresses through an ``/etc/hosts`` bind-mounted in a
private mount namespace, so admission runs exactly as on a host (the machine's own file is untouched).

Figures (CLOCK_MONOTONIC is system-wide, so the processes' stamps compare):
- joins: from the server's start to the first and the last host seated;
- barrier: from the last join to the server releasing the barrier, and to the last host hearing "go";
  goal: within 2 s;
- heartbeats: the first host's CPU (every thread of this process) over ``--window`` seconds after the
  barrier, at the default interval (``TRAINING_TOOLKIT_HEARTBEAT``), as % of one core; goal: under 5 %;
- verdict: from ``broadcast`` to its return (the first host's fan-out), and to the last host hearing it;
  goal: every host within 1 s;
- memory: the first host's RSS (and peak) with every host joined, and its thread count.

Every client runs on this machine's cores beside the server, so the client-side figures (the last
"go", the last verdict) include the clients' own scheduling: an upper bound of what real hosts see.
Needs root (a mount namespace).  Not part of CI; test/integration/test_bench_control_plane.py runs
it at a small N.

Usage: .venv/bin/python bench/control_plane.py [--hosts N] [--workers W] [--window S] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from queue import Empty, SimpleQueue

from training_toolkit.agent import barrier
from training_toolkit.cluster.client import ControlClient
from training_toolkit.cluster.events import Verdict
from training_toolkit.cluster.server import ControlServer
from training_toolkit.cluster.events import PeerLost

IN_NAMESPACE = "BENCH_CONTROL_PLANE_NS"
NET = "127.10"  # hosts at 127.10.x.y; the whole 127/8 is the loopback, no address to add
INTRO = {"ssh_host_key": "ssh-ed25519 " + "A" * 68 + " root@algo"}  # about what a real host introduces
GOALS = {"barrier_s": 2.0, "verdict_s": 1.0, "heartbeat_pct": 5.0}


def address(index: int) -> str:
    """Host ``algo-(index+1)``'s address: 250 hosts per /24 (no .0, no .255)."""
    return f"{NET}.{index // 250}.{index % 250 + 1}"


def hosts_file(n: int) -> str:
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"{address(i)} algo-{i + 1}" for i in range(n)]
    return "\n".join(lines) + "\n"


def free_port(bind: str) -> int:
    with socket.socket() as sock:
        sock.bind((bind, 0))
        return sock.getsockname()[1]


def status(field: str) -> int:
    """A number from /proc/self/status (kB for memory)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


# Clients -------------------------------------------------------------------------------------------


def client(index: int, master: str, port: int, timeout_s: float, out: list) -> None:
    """One host: join, ready, wait for "go", then for the verdict; its stamps go to ``out``."""
    host, events = f"algo-{index + 1}", SimpleQueue()
    record: dict = {"host": host}
    c = ControlClient(None, host, master, port, events, introduction=INTRO, source=address(index))
    try:
        c.connect(timeout_s)
        record["joined"] = time.monotonic()
        c.ready()
        c.wait_go(timeout_s)
        record["go"] = time.monotonic()
        while True:
            event = events.get(timeout=timeout_s)
            if isinstance(event, Verdict):
                record["verdict"] = time.monotonic()
                break
            if isinstance(event, PeerLost):
                record["error"] = f"lost the lead: {event.reason}"
                break
    except Empty:
        record["error"] = "no verdict"
    except Exception as exc:  # noqa: BLE001 - a host's failure is a figure of the run, reported as such
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        c.close()
        out.append(record)


def worker(first: int, last: int, master: str, port: int, timeout_s: float) -> None:
    """Hosts ``first`` .. ``last - 1`` (indexes), one thread each, all started at once; JSON records on stdout."""
    threading.stack_size(256 * 1024)
    out: list = []
    threads = [threading.Thread(target=client, args=(i, master, port, timeout_s, out), daemon=True)
               for i in range(first, last)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 3)
    json.dump(out, sys.stdout)


# The first host ------------------------------------------------------------------------------------


def wait_ready(server: ControlServer, events: SimpleQueue, hosts: list[str], timeout_s: float) -> None:
    """The first host's barrier as the agent decides it (the server only posts): its events through the pure rules."""
    roll = barrier.Roll()
    gate = barrier.Barrier(0, tuple(hosts[1:]), time.monotonic() + timeout_s, timeout_s)
    while True:
        outcome = barrier.decide(hosts[0], roll, gate, time.monotonic())
        if isinstance(outcome, barrier.Passed):
            return
        if isinstance(outcome, barrier.Failed):
            raise SystemExit(f"control plane: {outcome.outcome.reason}")
        try:
            roll = barrier.note(roll, events.get(timeout=max(0.0, outcome.until - time.monotonic())),
                                time.monotonic(), 0)
        except Empty:
            pass


def run(n: int, workers: int, window_s: float, timeout_s: float) -> dict:
    master = address(0)
    port = free_port(master)
    events: SimpleQueue = SimpleQueue()
    hosts = [f"algo-{i + 1}" for i in range(n)]
    server = ControlServer(None, hosts[1:], port, events, job_id="bench", hosts=hosts,  # every welcome lists them
                           introduction=INTRO, bind=master)
    bounds = [1 + (n - 1) * k // workers for k in range(workers + 1)]
    procs: list[subprocess.Popen] = []
    try:
        cpu0, start = time.process_time(), time.monotonic()
        rss0 = status("VmRSS")
        server.start()
        for a, b in zip(bounds, bounds[1:]):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", str(a), str(b), master, str(port), str(timeout_s)],
                stdout=subprocess.PIPE, text=True))
        wait_ready(server, events, hosts, timeout_s)
        ready = time.monotonic()
        server.release()
        released = time.monotonic()
        cpu_join = time.process_time() - cpu0
        memory = {"rss_before_mb": rss0 / 1024, "rss_joined_mb": status("VmRSS") / 1024,
                  "rss_peak_mb": status("VmHWM") / 1024, "threads": status("Threads")}
        time.sleep(min(2.0, window_s))  # the last "go"s land before the heartbeat window opens
        cpu1, w0 = time.process_time(), time.monotonic()
        time.sleep(window_s)
        heartbeat_pct = 100 * (time.process_time() - cpu1) / (time.monotonic() - w0)
        lost = []
        while not events.empty():
            event = events.get()
            if isinstance(event, PeerLost):
                lost.append(f"{event.host}: {event.reason}")
        v0 = time.monotonic()
        server.broadcast(Verdict(0, "", "algo-1"))
        v1 = time.monotonic()
        records = []
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout_s * 3)
            records += json.loads(out or "[]")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.close()
    errors = [f"{r['host']}: {r['error']}" for r in records if "error" in r]
    if len(records) != n - 1 or errors or lost:
        missing = n - 1 - len(records)
        raise SystemExit(f"control plane at {n} hosts failed: {missing} host(s) unaccounted for, "
                         f"{len(errors)} error(s) {errors[:5]}, lost {lost[:5]}")
    joined = sorted(r["joined"] for r in records)
    last_go = max(r["go"] for r in records)
    last_verdict = max(r["verdict"] for r in records)
    return {
        "hosts": n, "workers": workers, "cores": os.cpu_count(), "heartbeat_window_s": window_s,
        "first_join_s": joined[0] - start, "last_join_s": joined[-1] - start,
        "join_cpu_s": cpu_join,
        "barrier_release_after_last_join_s": released - joined[-1],
        "barrier_last_go_after_last_join_s": last_go - joined[-1],
        "barrier_s": last_go - joined[-1],
        "ready_wait_s": ready - start,
        "heartbeat_pct": heartbeat_pct,
        "verdict_fanout_s": v1 - v0,
        "verdict_s": last_verdict - v0,
        **memory,
    }


def report(figures: dict) -> str:
    f = figures
    ok = {k: ("met" if f[k] < goal else "MISSED") for k, goal in GOALS.items()}
    return "\n".join([
        f"control plane, {f['hosts']} hosts ({f['hosts'] - 1} joining, {f['workers']} client processes, "
        f"{f['cores']} cores shared with the clients)",
        f"  joins: first {f['first_join_s']:.2f} s, last {f['last_join_s']:.2f} s after the server started "
        f"(the first host's CPU meanwhile: {f['join_cpu_s']:.2f} s)",
        f"  barrier after the last join: released {f['barrier_release_after_last_join_s'] * 1000:.0f} ms, "
        f"last host heard go {f['barrier_last_go_after_last_join_s'] * 1000:.0f} ms "
        f"(goal < {GOALS['barrier_s']:g} s: {ok['barrier_s']})",
        f"  heartbeats: the first host at {f['heartbeat_pct']:.1f} % of one core over {f['heartbeat_window_s']:g} s "
        f"(goal < {GOALS['heartbeat_pct']:g} %: {ok['heartbeat_pct']})",
        f"  verdict: sent to all in {f['verdict_fanout_s'] * 1000:.0f} ms, last host heard it after "
        f"{f['verdict_s'] * 1000:.0f} ms (goal < {GOALS['verdict_s']:g} s: {ok['verdict_s']})",
        f"  memory: first host RSS {f['rss_before_mb']:.0f} MB before, {f['rss_joined_mb']:.0f} MB joined "
        f"(peak {f['rss_peak_mb']:.0f} MB), {f['threads']} threads",
    ])


def enter_namespace(argv: list[str]) -> None:
    """Re-run in a private mount namespace whose /etc/hosts names the job's hosts (gone when we exit)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        raise SystemExit("bench/control_plane.py needs root and unshare (a private mount namespace for /etc/hosts)")
    env = {**os.environ, IN_NAMESPACE: "1"}
    os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", "--",
                           sys.executable, __file__, *argv], env)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        first, last, master, port, timeout_s = sys.argv[2:7]
        worker(int(first), int(last), master, int(port), float(timeout_s))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    # 8: on a machine shared with other work, the clients' share of its cores grows with their processes
    # (4 left some clients unscheduled for 10 s at a load average of 48, and the first host declared them lost)
    parser.add_argument("--workers", type=int, default=8, help="client processes")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of heartbeats measured")
    parser.add_argument("--timeout", type=float, default=120.0, help="join and verdict deadline, seconds")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not 2 <= args.hosts <= 250 * 250:
        parser.error("--hosts is between 2 and 62500")
    if os.environ.get(IN_NAMESPACE) != "1":
        enter_namespace(sys.argv[1:])
    with tempfile.NamedTemporaryFile("w", prefix="bench-hosts-", suffix=".txt") as hosts:
        hosts.write(hosts_file(args.hosts))
        hosts.flush()
        subprocess.run(["mount", "--bind", hosts.name, "/etc/hosts"], check=True)
        figures = run(args.hosts, max(1, min(args.workers, args.hosts - 1)), args.window, args.timeout)
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
