"""What the container engine's service spends while `local --image` waits for a container's exit.

One container of the image runs ``sleep SECONDS`` with one line of output each 0.1 s, and the
launcher's side either waits for its exit from its start (``wait``, what the launcher did before) or
follows its log and asks for the exit once the log has ended (``logs``, what it does now).  The
engine's own CPU time (utime + stime of its service process, from /proc) over the container's life
is the figure; rounds interleave the two ways.  Run it against podman's service (its pid from
scripts/containers-ci.sh's pid file, or ENGINE_PID) or dockerd (ENGINE_PID).

Usage: DOCKER_HOST=unix:///... [ENGINE_PID=N] TT_IMAGE=IMAGE .venv/bin/python bench/engine_wait.py [ROUNDS] [SECONDS]
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

from training_toolkit.local import engine

IMAGE = os.environ.get("TT_IMAGE", "localhost/training-toolkit:cpu")
PODMAN_PID_FILE = Path("/run/training-toolkit-ci/podman-service.pid")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK  # utime, stime, and its reaped children's


def one(client, streams, pid: int, how: str, seconds: float) -> float:
    lines = max(1, int(seconds / 0.1))
    container = client.containers.create(IMAGE, entrypoint=["sh", "-c", f"for i in $(seq {lines}); do echo x; "
                                                            "sleep 0.1; done"], detach=True)
    try:
        container.start()
        before = cpu_s(pid)
        if how == "logs":
            for _ in streams.api.logs(container.id, stream=True, follow=True):
                pass
        container.wait()
        return cpu_s(pid) - before
    finally:
        container.remove(force=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    pid = int(os.environ.get("ENGINE_PID") or PODMAN_PID_FILE.read_text())
    client = engine.connect(engine.socket_url(os.environ))
    streams = engine.connect(engine.socket_url(os.environ), timeout_s=None)
    engine.check_image(client, IMAGE, engine.socket_url(os.environ))
    spent: dict[str, list[float]] = {"wait": [], "logs": []}
    for _ in range(rounds):
        for how, samples in spent.items():
            samples.append(one(client, streams, pid, how, seconds))
    version = client.version()
    print(f"engine {version.get('Components', [{}])[0].get('Name', '?')} {version['Version']} (pid {pid}), "
          f"a {seconds:g} s container, median of {rounds} interleaved rounds; the engine's CPU meanwhile:")
    print(f"  waiting for the exit from the start (before)       {statistics.median(spent['wait']):6.2f} s")
    print(f"  following the log, then asking for the exit (now)  {statistics.median(spent['logs']):6.2f} s")


if __name__ == "__main__":
    main()
