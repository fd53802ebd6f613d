"""Shared pieces of the benchmarks: job trees, the commands under test, timing."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OURS = REPO / ".venv" / "bin" / "train"
REFERENCE = Path(os.environ.get("REFERENCE_VENV", REPO / ".venv-ref")) / "bin" / "train"
PYTHON = REPO / ".venv" / "bin" / "python"


def make_tree(base: Path, script: str, entry: str = "job.py", hps: dict | None = None) -> Path:
    """A one-host job whose code is already in the code dir (no copy, no install)."""
    (base / "code").mkdir(parents=True, exist_ok=True)
    (base / "code" / entry).write_text(script)
    config = base / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    values = {"sagemaker_program": json.dumps(entry), **(hps or {})}
    (config / "hyperparameters.json").write_text(json.dumps(values))
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "inputdataconfig.json").write_text("{}")
    for sub in ("model", "output/data"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    return base


def env_for(base: Path) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root"),
           "SAGEMAKER_BASE_DIR": str(base), "SM_STUDIO_LOCAL_MODE": "true"}
    return env


def timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None, stdout=subprocess.DEVNULL) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=stdout, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed with {proc.returncode}")
    return elapsed


@contextlib.contextmanager
def before_tree(revision: str | None, where: Path):
    """The ``src`` of a detached worktree at ``revision`` for PYTHONPATH, compiled (None: no revision, nothing made)."""
    if revision is None:
        yield None
        return
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), revision], check=True,
                   capture_output=True)
    # bytecode compiled, as an installed toolkit (and this checkout's, once run) has it: no run pays for it
    subprocess.run([str(PYTHON), "-m", "compileall", "-q", str(where / "src")], check=True, capture_output=True)
    try:
        yield where / "src"
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def have_reference() -> bool:
    if not os.access(REFERENCE, os.X_OK):
        print(f"(reference not installed at {REFERENCE}: run scripts/setup-reference.sh)", file=sys.stderr)
        return False
    return True


class CpuMeter:
    """CPU time of this process and everything it starts from now on, whatever else the machine runs.

    Wall time on a 2-core machine shared with other work is noise; CPU seconds are not: the
    benchmark moves itself into a cgroup (v1 ``cpuacct``) of its own, which every process it
    starts inherits (namespace hosts, nsenter'd commands, sshd and its sessions, mpirun, ranks),
    and ``seconds()`` reads the group's total.  ``None`` where there is no such hierarchy or it
    cannot be written (say so beside the figure instead).
    """

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self) -> None:
        self.group: Path | None = None
        if not (self.ROOT / "cpuacct.usage").exists():
            return
        try:
            group = self.ROOT / f"bench-{os.getpid()}"
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group = group
        except OSError:
            pass

    def seconds(self) -> float | None:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9 if self.group else None

    def exclude_this_thread(self) -> None:
        """Meter no more of the calling thread (a sampler's own work); v1 groups hold threads, not only processes."""
        if self.group is not None:
            import threading

            (self.ROOT / "tasks").write_text(str(threading.get_native_id()))

    def close(self) -> None:
        if self.group is None:
            return
        (self.ROOT / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):  # the last of its processes may still be leaving
            try:
                self.group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        self.group = None


class LocalRun:
    """One job on a local cluster, timed: when it was called, when its hosts were up, how each ended."""

    def __init__(self, job, workdir: Path, tags: list[str], timeout_s: float = 300, before_start=None):
        import io

        from training_toolkit.local.launcher import run_local

        self.out = io.BytesIO()
        up: list[float] = []

        def hosts_up(cluster) -> None:
            up.append(time.monotonic())
            tags.append(cluster.tag)  # so the caller can check that nothing of it is left
            if before_start is not None:
                before_start(cluster)

        self.started = time.monotonic()
        self.results = run_local(job, workdir, environ=os.environ, timeout_s=timeout_s, out=self.out, before_start=hosts_up)
        self.returned = time.monotonic()
        self.hosts_up = up[0]

    def check(self, label: str, expect_success: bool = True) -> None:
        """Stop the benchmark, with the job's output, when the job did not end as expected."""
        codes = [r.exit_code for r in self.results]
        ok = all(c == 0 for c in codes) if expect_success else all(c not in (0, None) for c in codes)
        if not ok or any(r.ended_at is None for r in self.results):
            sys.stdout.buffer.write(self.out.getvalue())
            raise SystemExit(f"ours ({label}): exit codes {codes}, failures {[r.failure for r in self.results]}")
        left = {r.host: r.survivors for r in self.results if r.survivors}
        if left:
            raise SystemExit(f"ours ({label}): processes survived their host's train: {left}")

    @property
    def last_exit(self) -> float:
        return max(r.ended_at for r in self.results)


# What a job's script does first, for figures that end when the script starts (start to barrier):
# write time.monotonic() (CLOCK_MONOTONIC is system-wide) as SM_MODEL_DIR/started-RANK.
STAMP = """\
import os, time
started = time.monotonic()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "started-%s" % os.environ.get("RANK", "0")), "w") as f:
    f.write(repr(started))
"""


def stamps(results) -> list[float]:
    """Every process's start time that STAMP wrote, on every host."""
    return [float(f.read_text()) for r in results for f in r.model_dir.glob("started-*")]


# Run inside each prepared host of a bare mpirun: its ssh files written by the toolkit's own code, with
# one pair of keys made for the run (argv: KEYS_JSON DIR client|server HOSTS-or-ADDRESSES...).
WRITE_SSH_DIR = """\
import json, sys
from pathlib import Path
from training_toolkit.cluster.ssh.keys import KeyPair
from training_toolkit.cluster.ssh.layout import write_client_side, write_server_side
keys = json.load(open(sys.argv[1]))
client = KeyPair(keys["client"][0].encode(), keys["client"][1])
host = KeyPair(keys["host"][0].encode(), keys["host"][1])
if sys.argv[3] == "client":
    write_client_side(Path(sys.argv[2]), client_key=client, host_keys={h: host.public for h in sys.argv[4:]}, port=22)
else:
    write_server_side(Path(sys.argv[2]), host_key=host, authorized=[(client.public, sys.argv[4:])],
                      port=22, user="root")
"""
# Every worker's sshd answers the job's key; then the probe's shared connections are ended, so that
# a bare mpirun logs in to each host itself, as it does on any cluster (left open, they spared the
# bare baseline the logins the toolkit's own job pays: 0.1-0.2 s per host here).
WAIT_FOR_SSH = """\
import os
import sys
from pathlib import Path
from training_toolkit.cluster.ssh.layout import SshLayout, end_connections
from training_toolkit.cluster.ssh.probe import wait_for_ssh
layout = SshLayout(Path(sys.argv[1]), 22)
wait_for_ssh(layout, sys.argv[2:], deadline_s=30, environ=os.environ)
end_connections(layout)
"""
