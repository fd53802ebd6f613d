"""Reading the stacks of this host's ranks while they run (a stall), each in at most a few seconds.

Two ways, tried in this order for each process:

- **faulthandler**: the rank's interpreter registered ``faulthandler`` on
  ``SIGRTMIN+3`` at start (``stackhook/sitecustomize.py``, put on its
  ``PYTHONPATH`` while stalls are watched).  It needs no privilege, so it works
  in a default docker or podman container.  The signal goes only to a process
  that catches it (``procfs.catches``): one that exec'd another program is
  never killed by it.
- **py-spy** (``pip install 'training-toolkit[stacks]'``) reads any CPython
  process through ptrace: a process without the hook (``python -I``, a rank
  started another way) where ptrace is allowed (root on a bare host, or a
  container with ``CAP_SYS_PTRACE``).

A process neither way can read gets a note saying why, never a guess.
"""

from __future__ import annotations

import linecache
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from training_toolkit.supervise import pidfd, procfs
from training_toolkit.config.settings import HEARTBEAT_DIR_VAR, STACKS_DIR_VAR
from training_toolkit.stalls.stackreport import RankStack, parse_faulthandler, parse_pyspy, with_source, without_launcher

STACK_SIGNAL_OFFSET = 3  # the hook's own constant (it imports nothing of ours)
HOOK_DIR = Path(__file__).parent / "stackhook"  # __file__ is absolute: the package was imported from a path
READ_TIMEOUT_S = 3.0  # per process; every process of the host is read at once


class Watched(NamedTuple):
    """A process of this host whose stack is wanted."""

    pid: int
    rank: int | None
    name: str


def stack_signal() -> int:
    return signal.SIGRTMIN + STACK_SIGNAL_OFFSET


def script_env(directory: Path, environ: dict[str, str]) -> dict[str, str]:
    """What a watched rank's environment gets: the heartbeat directory, the stack files' directory and the hook."""
    path = [str(HOOK_DIR), *(p for p in environ.get("PYTHONPATH", "").split(":") if p and p != str(HOOK_DIR))]
    return {HEARTBEAT_DIR_VAR: str(directory / "heartbeats"), STACKS_DIR_VAR: str(directory / "stacks"),
            "PYTHONPATH": ":".join(path)}


def pyspy_path(setting: str | None = None) -> str | None:
    """The py-spy to use: the setting's (``none``: none), else the one beside our python, else on PATH."""
    if setting == "none":
        return None
    if setting:
        return setting
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("py-spy")


def gather(host: str, processes: Sequence[Watched], stacks_dir: Path | None, pyspy: str | None,
           timeout_s: float = READ_TIMEOUT_S) -> list[RankStack]:
    """Every process's stack, read at once, each within ``timeout_s``; ``pyspy``: see ``pyspy_path``."""
    results: list[RankStack | None] = [None] * len(processes)

    def read(i: int, proc: Watched) -> None:
        cwd = _cwd(proc.pid)
        frames, note = read_one(proc.pid, stacks_dir, pyspy, timeout_s)
        frames = with_source(without_launcher(frames), linecache.getline, cwd)
        results[i] = RankStack(host, proc.rank, proc.name, frames, note)

    threads = [threading.Thread(target=read, args=(i, p), name=f"stack-{p.pid}", daemon=True)
               for i, p in enumerate(processes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 1.0)
    return [r if r is not None else RankStack(host, p.rank, p.name, (), f"not read within {timeout_s:g} s")
            for r, p in zip(results, processes)]


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def read_one(pid: int, stacks_dir: Path | None, pyspy: str | None, timeout_s: float):
    """(frames, how they were read or why not) of one process."""
    if not procfs.alive(pid):
        return (), "ended before its stack was read"
    failed = []
    if stacks_dir is not None:
        stack_file = stacks_dir / f"{pid}.stack"
        if stack_file.is_file() and procfs.catches(pid, stack_signal()):
            frames = _by_faulthandler(pid, stack_file, timeout_s)
            if frames:
                return frames, "faulthandler"
            failed.append("faulthandler wrote nothing")
    if pyspy is not None:
        frames, why = _by_pyspy(pyspy, pid, timeout_s)
        if frames:
            return frames, "py-spy"
        failed.append(f"py-spy: {why}")
    else:
        failed.append("no faulthandler hook, and no py-spy")
    return (), "; ".join(failed)


def _by_faulthandler(pid: int, stack_file: Path, timeout_s: float):
    before = stack_file.stat().st_size
    # through a pidfd, and only to a process that still catches the signal (its default action ends it)
    held = pidfd.hold(pid, check=lambda p: procfs.catches(p, stack_signal()))
    if held is None:
        return ()
    try:
        if not held.send(stack_signal()):
            return ()
    finally:
        held.close()
    end = time.monotonic() + timeout_s
    size, stable_since = before, None
    while time.monotonic() < end:
        time.sleep(0.01)
        now = stack_file.stat().st_size
        if now > before and now == size:
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since >= 0.03:
                break
        else:
            stable_since = None
        size = now
    with open(stack_file, "rb") as f:
        f.seek(before)
        return parse_faulthandler(f.read().decode(errors="replace"))


#: py-spy's whole environment: it reads /proc and runs nothing, so it needs none of the job's (nor its secrets)
PYSPY_ENV = {"PATH": "/usr/bin:/bin"}


def _by_pyspy(pyspy: str, pid: int, timeout_s: float):
    try:
        done = subprocess.run([pyspy, "dump", "--full-filenames", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=timeout_s, env=PYSPY_ENV)
    except subprocess.TimeoutExpired:
        return (), f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return (), str(exc.strerror or exc)
    frames = parse_pyspy(done.stdout)
    if frames:
        return frames, ""
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return (), (lines[0][:200] if lines else f"exit code {done.returncode}")
