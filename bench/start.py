"""Where one host's start goes: the interpreter, train's imports and own work, sshd's start, one ssh login.

Each part is timed on its own, R rounds interleaved, and reported as the minimum (the figure a
loaded machine disturbs least) and the median:

- ``python``: ``python -c pass`` with the toolkit's interpreter (the interpreter and site);
- ``imports``: ``python -c "import training_toolkit.cli"`` (every host), and with what an MPI host
  imports besides (the agent, the channel, ssh, the MPI runner), minus ``python``; with bytecode
  compiled, as an installed toolkit has it;
- ``train to script``: from spawning ``train`` (a one-host job, code in place, nothing to install)
  to the script's first line (it writes ``time.monotonic()``; CLOCK_MONOTONIC is system-wide);
  ``train to exit``: to train's exit;
- ``sshd -t``: the config check ``Sshd.start`` runs first; ``sshd start``: ``Sshd.start()`` from
  call to return (the check, the daemon's start, until its pid file says it listens);
- ``ssh login``: the first host's readiness probe of one host: a new ``ControlMaster`` login
  running ``true``, to its exit; ``ssh over master``: mpirun's later login over that connection;
- ``ssh master RSS``: the memory the first host keeps per peer for the job (the master process).

Then the toolkit's own modules by import time (self, minimum over the rounds) and the cumulative
time of train's own steps (cProfile of ``train_main`` on the same job, one round).  Needs root
(sshd) and openssh.  Usage: .venv/bin/python bench/start.py [ROUNDS]
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from common import OURS, PYTHON, env_for, make_tree

from training_toolkit.cluster.ssh.keys import generate_keypair
from training_toolkit.cluster.ssh.layout import ssh_command, write_client_side, write_server_side
from training_toolkit.cluster.ssh.sshd import Sshd
from training_toolkit.cluster.ssh.layout import end_connections

STAMP = "import time\nopen('stamp', 'w').write(repr(time.monotonic()))\n"


def compiled_env() -> dict[str, str]:
    """This environment, with bytecode written: an installed toolkit has its .pyc files (pip compiles them);
    with PYTHONDONTWRITEBYTECODE set, every module changed since its .pyc was compiled again at each start."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def warm_up() -> None:
    subprocess.run([str(PYTHON), "-c", "import training_toolkit.cli, training_toolkit.agent.loop, training_toolkit.runners.mpi"],
                   env=compiled_env(), check=True)


def timed(cmd: list[str], env: dict | None = None) -> float:
    began = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - began


def train_round(tree: Path) -> tuple[float, float]:
    stamp = tree / "code" / "stamp"
    stamp.unlink(missing_ok=True)
    began = time.monotonic()
    subprocess.run([str(OURS)], env=env_for(tree), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # env_for: no PYTHONDONTWRITEBYTECODE
    ended = time.monotonic()
    return float(stamp.read_text()) - began, ended - began


def import_times(rounds: int, statement: str) -> list[tuple[str, float]]:
    """Modules by self import time (µs, minimum over ``rounds``) of ``statement``."""
    best: dict[str, float] = defaultdict(lambda: float("inf"))
    for _ in range(rounds):
        err = subprocess.run([str(PYTHON), "-X", "importtime", "-c", statement],
                             capture_output=True, text=True, check=True, env=compiled_env()).stderr
        for line in err.splitlines()[1:]:
            parts = line.split("|")
            if len(parts) == 3:
                best[parts[2].strip()] = min(best[parts[2].strip()], float(parts[0].split(":")[1]))
    return sorted(best.items(), key=lambda item: -item[1])


def profile_train(tree: Path) -> str:
    """train_main's own steps by cumulative time (one run, in this process: the imports are already done)."""
    from training_toolkit.cli import train_main

    os.environ.update(env_for(tree))
    profiler = cProfile.Profile()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1)
    os.dup2(devnull, 1)
    try:
        profiler.runcall(train_main, [])
    finally:
        os.dup2(saved, 1)
        os.close(devnull)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(r"training_toolkit", 18)
    return out.getvalue()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sshd_rounds(rounds: int, base: Path) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = defaultdict(list)
    client, host = generate_keypair("bench-client"), generate_keypair("bench-host")
    user = os.environ.get("USER", "root")
    for r in range(rounds):
        port = free_port()
        server = write_server_side(base / f"server-{r}", host_key=host, authorized=[(client.public, ["127.0.0.1"])],
                                   port=port, user=user, listen_addresses=["127.0.0.1"])
        near = write_client_side(base / f"client-{r}", client_key=client, host_keys={"127.0.0.1": host.public}, port=port)
        figures["sshd -t"].append(timed([Sshd(server).sshd_path, "-t", "-f", str(server.sshd_config)]))
        sshd = Sshd(server)
        began = time.monotonic()
        sshd.start()
        figures["sshd start"].append(time.monotonic() - began)
        try:
            ssh = ssh_command(near)
            figures["ssh login"].append(timed([*ssh, "127.0.0.1", "true"]))
            figures["ssh over master"].append(timed([*ssh, "127.0.0.1", "true"]))
            masters = subprocess.run(["pgrep", "-f", f"ssh.*{near.directory}/cm-"], capture_output=True, text=True).stdout.split()
            rss = [int(line.split()[1]) for pid in masters
                   for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:")]
            if rss:
                figures["ssh master RSS (MB)"].append(max(rss) / 1024)
        finally:
            end_connections(near)
            sshd.stop()
    return figures


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    figures: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        tree = make_tree(Path(tmp) / "job", STAMP)
        warm_up()
        for _ in range(rounds):
            figures["python"].append(timed([str(PYTHON), "-c", "pass"], compiled_env()))
            figures["python + imports"].append(timed([str(PYTHON), "-c", "import training_toolkit.cli"], compiled_env()))
            figures["python + an MPI host's imports"].append(
                timed([str(PYTHON), "-c", "import training_toolkit.cli, training_toolkit.agent.loop, training_toolkit.runners.mpi"],
                      compiled_env()))
            to_script, to_exit = train_round(tree)
            figures["train to script"].append(to_script)
            figures["train to exit"].append(to_exit)
        with tempfile.TemporaryDirectory(prefix="bench-ssh-", dir="/run") as ssh_base:  # keys: removed at the end
            figures.update(sshd_rounds(rounds, Path(ssh_base)))
        load = os.getloadavg()[0]
        print(f"one host's start, {rounds} rounds (load average {load:.1f} on {os.cpu_count()} cores: noisy)")
        print("| part | min | median |\n| --- | --- | --- |")
        for name, values in figures.items():
            unit, scale = ("MB", 1) if "MB" in name else ("ms", 1000)
            print(f"| {name} | {min(values) * scale:.1f} {unit} | {statistics.median(values) * scale:.1f} {unit} |")
        for statement in ("import training_toolkit.cli",
                          "import training_toolkit.cli, training_toolkit.agent.loop, training_toolkit.runners.mpi"):
            imports = import_times(rounds, statement)
            total = sum(us for name, us in imports)
            print(f"\n`{statement}`: {len(imports)} modules, self times (min over {rounds} runs) {total / 1000:.1f} ms in all")
            for name, us in imports[:12]:
                print(f"  {us / 1000:6.2f} ms  {name}")
        print("\ntrain_main's steps (cProfile, one run, imports already done; profiling slows each call):")
        print(profile_train(tree))


if __name__ == "__main__":
    main()
