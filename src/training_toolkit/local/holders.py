"""A host's own hostname and mounts: one *holder* process per host owns its UTS and mount namespaces.

A holder is a ``sleep infinity`` started inside the host's network namespace,
in fresh UTS and mount namespaces, after it has set the hostname and mounted
the host's ``/opt/ml``, the cluster's ``/etc/hosts`` and a tmpfs on ``/run``.
Commands run in a host by entering the holder's namespaces with ``nsenter``;
an sshd started there passes the same namespaces on to every session it serves.
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from training_toolkit.errors import ClusterError
from training_toolkit.local.network import SYSTEM_ENV

# Run by each holder as `sh -c SCRIPT holder HOSTNAME OPT_ML_SOURCE HOSTS_FILE`, already inside
# the host's network namespace and in fresh UTS and mount namespaces with private propagation
# (so none of these mounts appear outside). Why each step:
# - hostname through /proc: it is per UTS namespace and needs no `hostname` binary;
# - /run/netns is unmounted first: the copied bind mounts of *other* namespaces would otherwise
#   keep those namespaces alive (private propagation stops their unmount from reaching this
#   copy) until this holder dies;
# - a tmpfs on /run gives the host its own /run/sshd (sshd's privilege separation directory)
#   and pid files;
# - "ready" tells the cluster that every mount is in place, before the holder turns into `sleep`.
HOLDER_SCRIPT = r"""set -e
exec 2>&1
printf '%s' "$1" > /proc/sys/kernel/hostname
umount --recursive --lazy /run/netns 2>/dev/null || :
mount --bind "$2" /opt/ml
mount --bind "$3" /etc/hosts
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mkdir -m 0755 /run/sshd
echo ready
exec sleep infinity </dev/null >/dev/null 2>&1
"""


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
    """Pid of the holder process whose net, mount and UTS namespaces are the host's."""

    @property
    def opt_ml(self) -> Path:
        """Where the host's ``/opt/ml`` lives on the real filesystem."""
        return self.root / "opt" / "ml"


def prepare_files(workdir: Path, names: Sequence[str], hosts_file: Path, hosts_text: str) -> None:
    """Per-host roots and the shared hosts file must exist before they are bind-mounted."""
    workdir.mkdir(parents=True, exist_ok=True)
    # The mount point for the per-host bind mounts; harmless on a machine without it.
    Path("/opt/ml").mkdir(parents=True, exist_ok=True)
    for name in names:
        opt_ml = workdir / name / "opt" / "ml"
        if not opt_ml.is_dir():
            opt_ml.mkdir(parents=True)
            # 0755 whatever the umask: sshd's StrictModes rejects key files below a
            # group- or world-writable directory, and /opt/ml is on that path.
            opt_ml.chmod(0o755)
    hosts_file.write_text(hosts_text)


def holder_argv(nsenter: str, unshare: str, netns: Path, name: str, opt_ml: Path, hosts_file: Path) -> list[str]:
    """The command that becomes a host's holder, entering the host's network namespace file ``netns``."""
    return [
        nsenter, f"--net={netns}", "--",
        unshare, "--uts", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", HOLDER_SCRIPT, "holder", name, str(opt_ml), str(hosts_file),
    ]


def start_holder(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(SYSTEM_ENV),
        # Own session: a Ctrl-C meant for the caller must not kill the hosts before
        # the cluster's close() gets to kill what runs inside them.
        start_new_session=True,
    )


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
    proc.stdout.close()  # the holder's sleep writes nothing; keep no pipe open per host
    return True, output.decode(errors="replace")


def enter_argv(nsenter: str, holder: int, argv: Sequence[str | os.PathLike[str]], cwd: str | os.PathLike[str] | None) -> list[str]:
    """The command line that runs ``argv`` in the namespaces of ``holder``; pure, nothing is started.

    nsenter starts the command in ``/`` of the host, not in the caller's directory, so a
    working directory is passed as ``--wdns``: it is resolved inside the host, where
    ``/opt/ml`` is the host's own.  nsenter execs the command, so the process started is
    the command itself: its pid, signals and exit status are the command's.
    """
    prefix = [nsenter, f"--target={holder}", "--net", "--mount", "--uts"]
    if cwd is not None:
        prefix.append(f"--wdns={os.fspath(cwd)}")
    return prefix + ["--"] + [os.fspath(a) for a in argv]
