"""The dead-man switch (supervise/deadman.py, native/deadman.c): its owner killed, what it watched ends; nothing else."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from training_toolkit.supervise import procfs
from training_toolkit.supervise import deadman

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

#: Seconds after the owner's SIGKILL by which what it watched must be gone.
BOUND_S = 5

# The owner: arms a deadman for DIR, starts what it must end and what it must not, prints the pids, waits.
OWNER = r"""
import json, os, subprocess, sys, time
from pathlib import Path
from training_toolkit.supervise import procfs
from training_toolkit.supervise.deadman import Deadman, environment_for
directory, pidfds = Path(sys.argv[1]), sys.argv[2] == "1"
d = Deadman(directories=[directory], pidfds=pidfds)
env = {"PATH": "/usr/bin:/bin"}
def started(argv, env, children=0):
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    while len([p for p in procfs.descendants(proc.pid) if not p.zombie]) < children:
        time.sleep(0.01)
    return proc
# carries the token; so does the sleep it leaves (the shell is replaced, the sleep re-parented)
marked = started(["sh", "-c", "sleep 300 & exec sleep 301"], {**env, **d.environment()}, 1)
# no token: held by pid; its child clears its environment, and is ended as a descendant
watched = started(["sh", "-c", "env -i /bin/sleep 302 & exec sleep 303"], env, 1)
d.watch(watched.pid)
for_dir = started(["sleep", "304"], {**env, **environment_for(directory)})  # ssh's shared connection, say
# names the directory in its command line, and has no token: not ours
unrelated = started(["sh", "-c", "sleep 305; :", str(directory)], env, 1)
below = lambda proc: [p.pid for p in procfs.descendants(proc.pid)]
print(json.dumps({"ours": [marked.pid, *below(marked), watched.pid, *below(watched), for_dir.pid],
                  "unrelated": unrelated.pid, "deadman": d.pid}), flush=True)
if sys.argv[3] == "disarm":
    d.disarm()
    print("disarmed", flush=True)
time.sleep(300)
"""


class Owner:
    def __init__(self, directory, *, pidfds: bool = True, disarm: bool = False):
        self.proc = subprocess.Popen([sys.executable, "-c", OWNER, str(directory), "1" if pidfds else "0",
                                      "disarm" if disarm else "-"], stdout=subprocess.PIPE, text=True)
        said = json.loads(self.proc.stdout.readline())
        if disarm:
            assert self.proc.stdout.readline() == "disarmed\n"
        self.ours: list[int] = said["ours"]
        self.unrelated: int = said["unrelated"]
        self.deadman: int = said["deadman"]
        # held from here on: a pid reused later is never mistaken for these
        self.fds = {pid: os.pidfd_open(pid) for pid in [*self.ours, self.unrelated]}

    def running(self, pid: int) -> bool:
        return not select.select([self.fds[pid]], [], [], 0)[0]

    def kill(self) -> float:
        self.proc.kill()
        self.proc.wait()
        return time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.running(self.unrelated):  # its shell leads its own group: the sleep in it goes too
            os.killpg(self.unrelated, signal.SIGKILL)
        for fd in self.fds.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(fd)


@pytest.fixture
def job_dir(tmp_path):
    directory = tmp_path / "job-ssh"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "id_ed25519").write_text("a key")
    os.symlink("/etc", directory / "link")  # removed as a link: nothing it points to is touched
    return directory


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfds", "no-pidfds"])
def test_the_owner_killed_what_it_watched_ends_and_its_directory_goes_but_not_an_unrelated_process(job_dir, pidfds):
    owner = Owner(job_dir, pidfds=pidfds)
    try:
        assert str(job_dir) in procfs.cmdline(owner.unrelated)
        killed = owner.kill()
        while left := [procfs.describe(pid) for pid in owner.ours if owner.running(pid)]:
            assert time.monotonic() - killed < BOUND_S, f"alive {BOUND_S} s after their owner was killed: {left}"
            time.sleep(0.01)
        print(f"\nlast watched process gone {time.monotonic() - killed:.3f} s after its owner")
        deadline = time.monotonic() + BOUND_S
        while job_dir.exists() or procfs.alive(owner.deadman):
            assert time.monotonic() < deadline, "the directory is left, or the deadman did not exit"
            time.sleep(0.01)
        assert os.path.isdir("/etc")
        # its command line names the directory, but it has no token and is in no watched tree
        assert owner.running(owner.unrelated)
    finally:
        owner.close()


def test_disarmed_it_exits_and_ends_nothing(job_dir):
    owner = Owner(job_dir, disarm=True)
    try:
        assert not procfs.alive(owner.deadman)  # the only process that could end them is gone before its owner
        owner.kill()  # and the owner is reaped when this returns: nothing is left to end them
        assert all(owner.running(pid) for pid in [*owner.ours, owner.unrelated])
        assert job_dir.exists()
    finally:
        owner.close()


def test_then_runs_in_its_place_only_if_the_owner_died(tmp_path):
    """The container reaper: run once the launcher is gone without having said done."""
    script = ("import sys; from training_toolkit.supervise.deadman import Deadman\n"
              "d = Deadman(then=['sh', '-c', 'echo reaped > \"$0\"', sys.argv[1]])\n"
              "print(d.pid, flush=True)\n"
              "sys.stdin.readline()\n"  # the test holds the deadman (its pidfd) before a disarm can end it
              "if sys.argv[2] == 'disarm': d.disarm()\n"
              "print('on', flush=True)\n"
              "import time; time.sleep(300)\n")
    for how in ("disarm", "die"):
        said = tmp_path / how
        owner = subprocess.Popen([sys.executable, "-c", script, str(said), how], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        fd = None
        try:
            fd = os.pidfd_open(int(owner.stdout.readline()))
            owner.stdin.write("go\n")
            owner.stdin.flush()
            assert owner.stdout.readline() == "on\n"  # disarmed, if it was to be, before the owner dies
            owner.kill()
            owner.wait()
            assert select.select([fd], [], [], BOUND_S)[0], "the deadman did not exit"
            assert said.exists() is (how == "die")
        finally:
            owner.kill()
            owner.wait()
            if fd is not None:
                os.close(fd)


def test_a_hold_the_look_does_not_confirm_is_refused(tmp_path):
    """``watch PID START`` with a start time that is not the process's (the pid went to another): not held."""
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    program = str(deadman.native.path_of(deadman.PROGRAM))
    try:
        for flags in ([], ["--no-pidfd"]):
            d = subprocess.Popen([program, *flags], stdin=subprocess.PIPE, start_new_session=True)
            d.stdin.write(f"watch {victim.pid} {procfs.read(victim.pid).start + 1}\n".encode())
            d.stdin.close()  # the owner died
            assert d.wait(BOUND_S) == 0
            assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_supervised_children_are_watched_by_their_own_deadman():
    from training_toolkit.supervise.process import TOKEN_VAR, Supervised

    child = Supervised(["sleep", "60"], {"PATH": "/usr/bin:/bin"}, relay_stderr=False)
    try:
        assert procfs.has_marker(child.pid, f"{TOKEN_VAR}={child._deadman.token}".encode())
        assert procfs.alive(child._deadman.pid)
    finally:
        child.stop(signal.SIGKILL, 0.1)
        child.wait(5)
        child.finish()
    assert not procfs.alive(child._deadman.pid)


def test_the_container_reaper_runs_once_its_launcher_died():
    """``local --image``'s reaper is the same switch with ``then``: here it finds no engine, and says so."""
    script = ("import os, time; from training_toolkit.local import reaper; from training_toolkit.supervise.deadman import Deadman\n"
              "d = Deadman(then=reaper.command('tt-test-job'), env={**os.environ, 'DOCKER_HOST': 'unix:///nonexistent.sock'})\n"
              "print('armed', flush=True); time.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert owner.stdout.readline() == "armed\n"
    owner.kill()
    owner.wait()
    said = owner.stderr.read()  # to its end: the reaper holds the launcher's stderr until it exits
    assert "the launcher of job tt-test-job died; removing the job failed: no container engine" in said, said


def test_a_marker_behind_a_large_environment_is_found():
    """The whole environment is read (the ranks' can be long), and the owner's last word may lack its newline."""
    program = str(deadman.native.path_of(deadman.PROGRAM))
    marked = subprocess.Popen(["sleep", "60"], env={**{f"A_BIG_{i}": "x" * 60_000 for i in range(5)}, "TT_DEADMAN_TEST": "big"},
                              start_new_session=True)
    try:
        while not procfs.has_marker(marked.pid, b"TT_DEADMAN_TEST=big"):
            time.sleep(0.01)
        spared = subprocess.Popen([program, "--marker", "TT_DEADMAN_TEST=big"], stdin=subprocess.PIPE)
        spared.communicate(b"done", timeout=BOUND_S)  # no newline: still done
        assert spared.returncode == 0 and marked.poll() is None
        fired = subprocess.Popen([program, "--marker", "TT_DEADMAN_TEST=big"], stdin=subprocess.PIPE)
        fired.communicate(b"", timeout=BOUND_S)
        assert marked.wait(BOUND_S) == -signal.SIGKILL
    finally:
        marked.kill()
        marked.wait()


def test_without_the_native_program_nothing_is_armed_and_that_is_said_once(monkeypatch, capsys):
    def missing(name, directory=None):
        raise deadman.native.NativeMissing(f"{name} is missing")

    monkeypatch.setattr(deadman.native, "path_of", missing)
    monkeypatch.setattr(deadman, "_warned", False)
    first, second = deadman.Deadman(), deadman.Deadman()
    assert first.pid is None and second.pid is None
    first.watch(os.getpid())
    first.disarm()
    assert capsys.readouterr().err.count("no dead-man switch") == 1
