"""A host's own namespaces: one *holder* process per host owns them, and dies with the launcher.

A holder starts in fresh network, UTS, IPC, mount and PID namespaces, as a container
does.  It sets the hostname, mounts the host's ``/opt/ml``, the cluster's
``/etc/hosts``, its own ``/proc`` and fresh tmpfs on ``/run`` and ``/dev/shm``, then
becomes the host's init: PID 1 of its PID namespace, reaping orphans as an init does.
Commands run in a host by entering the init's namespaces with ``nsenter``; an sshd
started there passes the same namespaces on to every session it serves.

Nothing of a host outlives its holder, and no holder outlives the launcher that
started it, with nobody's cooperation:

- a holder runs under ``setpriv --pdeathsig KILL``: the kernel kills it when the
  thread that started it dies (the launcher's, SIGKILL included);
- ``unshare --kill-child`` passes that on to the init it forked;
- when a PID namespace's init dies, the kernel kills every process in it (ranks,
  mpirun's daemons, sshd and its sessions);
- the namespaces have no name (no ``ip netns`` bind mount): the kernel frees each
  when its last process is gone, the network's veth ends and the mounts with it.

The cluster's switch (the namespace of the bridge) is held the same way.
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import subprocess
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from training_toolkit.supervise import pidfd, procfs
from training_toolkit.core.errors import ClusterError
from training_toolkit.local import layout
from training_toolkit.local.network import SYSTEM_ENV

#: Every holder's environment carries ``MARKER=<cluster tag>``, so the processes that hold a cluster
#: can be found from its tag alone (leftovers, a tag in use), even by another process.
MARKER = "TT_LOCAL_CLUSTER"

# Run by each holder's init as `sh -c SCRIPT holder HOSTNAME OPT_ML_SOURCE HOSTS_FILE PYTHON INIT`, inside
# its fresh namespaces, /proc already mounted for its PID namespace, with private mount propagation
# (so none of these mounts appear outside). Why each step:
# - hostname through /proc: it is per UTS namespace and needs no `hostname` binary;
# - /run/netns is unmounted first: the copied bind mounts of the machine's named namespaces
#   would otherwise keep those namespaces alive as long as this host lives;
# - a tmpfs on /run gives the host its own /run/sshd (sshd's privilege separation directory)
#   and pid files; one on /dev/shm its own shared memory, as a container has;
# - pids start at a random place: every host shares the machine's /tmp, where Open MPI names its
#   session directory /tmp/ompi.HOST.UID/pid.PID: two clusters' algo-1 must not meet there (pids
#   starting at 1 everywhere made them meet, and one job's end removed the other's directory);
# - "ready" tells the cluster that every mount is in place, before the init starts.
HOLDER_SCRIPT = r"""set -e
exec 2>&1
max=$(cat /proc/sys/kernel/pid_max)
if [ "$max" -gt 20000 ]; then
    r=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
    echo $((1000 + r % (max - 11000))) > /proc/sys/kernel/ns_last_pid
fi
printf '%s' "$1" > /proc/sys/kernel/hostname
umount --recursive --lazy /run/netns 2>/dev/null || :
mount --bind "$2" /opt/ml
mount --bind "$3" /etc/hosts
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mkdir -m 0755 /run/sshd
echo ready
exec "$4" -I -S -c "$5" </dev/null >/dev/null 2>&1
"""

# The host's init: reaps every child it gets (orphans of the host are re-parented to it) and does
# nothing else.  SIGCHLD stays blocked, so an exit between two looks is never missed.  As PID 1 it
# ignores every signal it has no handler for; only the kernel's SIGKILL ends it.
INIT = """import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    signal.sigwaitinfo({signal.SIGCHLD})
"""

# The switch only holds the bridge's network namespace; it has no children to reap.
SWITCH_SCRIPT = "echo ready; exec sleep infinity </dev/null >/dev/null 2>&1"


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of a local cluster, as seen from outside it."""

    name: str
    """Hostname inside the namespace, e.g. ``algo-1``."""
    address: str
    """IPv4 address of the host's ``eth0``, e.g. ``192.0.2.11``."""
    root: Path
    """Per-host directory on the real filesystem; ``root / "opt/ml"`` is ``/opt/ml`` inside."""
    pid: int
    """Pid (as the launcher sees it) of the host's init, whose namespaces are the host's."""

    @property
    def opt_ml(self) -> Path:
        """Where the host's ``/opt/ml`` lives on the real filesystem."""
        return layout.host_opt_ml(self.root.parent, self.root.name)


def prepare_files(workdir: Path, names: Sequence[str], hosts_file: Path, hosts_text: str) -> None:
    """Per-host roots and the shared hosts file must exist before they are bind-mounted."""
    workdir.mkdir(parents=True, exist_ok=True)
    # The mount point for the per-host bind mounts; harmless on a machine without it.
    Path("/opt/ml").mkdir(parents=True, exist_ok=True)
    for name in names:
        opt_ml = layout.host_opt_ml(workdir, name)
        if not opt_ml.is_dir():
            opt_ml.mkdir(parents=True)
            # 0755 whatever the umask: sshd's StrictModes rejects key files below a
            # group- or world-writable directory, and /opt/ml is on that path.
            opt_ml.chmod(0o755)
    hosts_file.write_text(hosts_text)


def holder_argv(tools: dict[str, str], name: str, opt_ml: Path, hosts_file: Path, python: str) -> list[str]:
    """The command that becomes a host's holder (``tools``: setpriv and unshare by path); pure."""
    return [
        tools["setpriv"], "--pdeathsig", "KILL", "--",
        tools["unshare"], "--net", "--uts", "--ipc", "--mount", "--pid", "--kill-child=SIGKILL",
        "--mount-proc", "--propagation", "private", "--",
        "/bin/sh", "-c", HOLDER_SCRIPT, "holder", name, str(opt_ml), str(hosts_file), python, INIT,
    ]


def switch_argv(tools: dict[str, str]) -> list[str]:
    """The command that becomes the cluster's switch: it holds the bridge's network namespace; pure."""
    return [tools["setpriv"], "--pdeathsig", "KILL", "--", tools["unshare"], "--net", "--",
            "/bin/sh", "-c", SWITCH_SCRIPT]


def start_holder(argv: Sequence[str], tag: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**SYSTEM_ENV, MARKER: tag},
        # Own session: a Ctrl-C meant for the caller must not kill the hosts before
        # the cluster's close() gets to stop what runs inside them.
        start_new_session=True,
    )


def holding(tag: str) -> list[int]:
    """The live processes that hold a cluster with this tag (holders, inits, switch)."""
    return procfs.with_marker(f"{MARKER}={tag}".encode())


def wait_until_ready(name: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    """Return once the holder says its namespaces are set up; ClusterError, with what it said, if not."""
    ready, output = _read_until_ready(proc, deadline)
    if not ready:
        state = "timed out" if proc.poll() is None else f"exited with {proc.returncode}"
        raise ClusterError(f"host {name}: setting up its namespaces {state}: {output.strip() or '(no output)'}")


def _read_until_ready(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bool, str]:
    """Read a holder's output until it says "ready", exits, or the deadline passes."""
    assert proc.stdout is not None
    output = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"ready\n" not in output:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return False, output.decode(errors="replace")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return False, output.decode(errors="replace")
            output += chunk
    proc.stdout.close()  # the init writes nothing; keep no pipe open per host
    return True, output.decode(errors="replace")


def init_of(holder: subprocess.Popen[bytes]) -> int:
    """The pid of the init a ready holder forked (its one child: unshare forks once)."""
    children = _children(holder.pid)
    if len(children) != 1:
        raise ClusterError(f"holder {holder.pid} has {len(children)} children, not its one init")
    return children[0]


def enter_argv(nsenter: str, init: int, argv: Sequence[str | os.PathLike[str]], cwd: str | os.PathLike[str] | None) -> list[str]:
    """The command line that runs ``argv`` in the namespaces of the host whose init is ``init``; pure.

    nsenter starts the command in ``/`` of the host, not in the caller's directory, so a
    working directory is passed as ``--wdns``: it is resolved inside the host, where
    ``/opt/ml`` is the host's own.  To enter the PID namespace nsenter forks: the command
    is nsenter's child (``EnteredProcess`` hides that).
    """
    prefix = [nsenter, f"--target={init}", "--net", "--mount", "--uts", "--ipc", "--pid"]
    if cwd is not None:
        prefix.append(f"--wdns={os.fspath(cwd)}")
    return prefix + ["--"] + [os.fspath(a) for a in argv]


#: How long nsenter may take to fork the command, once started.
FORK_TIMEOUT_S = 5.0


class EnteredProcess(subprocess.Popen):  # type: ignore[type-arg]
    """A command started in a host through ``enter_argv``: a Popen whose signals reach the command.

    nsenter forks into the host's PID namespace, waits for the command, and exits as it
    did (by the same signal too), so ``pid`` (nsenter's, in the host's network namespace),
    ``poll()``, ``wait()`` and ``returncode`` already stand for the command.  But nsenter
    passes no signal on: ``send_signal`` (``terminate``, ``kill``) goes to the command
    itself, through a pidfd taken once nsenter has forked and checked to be nsenter's child
    after it was opened (``supervise/pidfd.py``), so a reused pid is never hit.
    ``command_pid`` is the command's pid as the launcher sees it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.command_pid: int | None = None
        self._held: pidfd.Held | None = None
        deadline = time.monotonic() + FORK_TIMEOUT_S
        delay = 0.0002
        while self.poll() is None and time.monotonic() < deadline:
            children = _children(self.pid)
            if children:
                self.command_pid = children[0]
                # None: already gone (nsenter is about to exit as it did)
                self._held = pidfd.hold(children[0], check=lambda pid: _parent(pid) == self.pid)
                if self._held is not None:
                    weakref.finalize(self, self._held.close)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        if self._held is None:
            super().send_signal(sig)  # no command (yet, or at all): nsenter itself
            return
        self._held.send(sig)


def run_to_completion(popen: Callable[..., EnteredProcess], timeout: float, **run_kwargs: Any
                      ) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` over ``popen`` (``check``, ``capture_output``, ``input`` as there): at the timeout
    the command itself is killed and reaped, then ``TimeoutExpired`` goes on."""
    check = run_kwargs.pop("check", False)
    if run_kwargs.pop("capture_output", False):
        run_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    given = run_kwargs.pop("input", None)
    if given is not None:
        run_kwargs["stdin"] = subprocess.PIPE
    with popen(**run_kwargs) as proc:
        try:
            out, err = proc.communicate(given, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result


def _parent(pid: int) -> int | None:
    proc = procfs.read(pid)
    return proc.ppid if proc is not None else None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []
