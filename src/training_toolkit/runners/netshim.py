"""The accept() shim (native/netshim.c): what a process preloaded with it is told, and the preload list.

Open MPI's runtime and BTL accept anyone; the listener guard filters their listeners
from outside, but where the kernel refuses a socket filter (a container without
CAP_NET_ADMIN) it can only cut a connection 20-250 ms after it came, once the
program has read it (docs/security.md).  The shim is preloaded into mpirun, the
daemons and the ranks, each by its own route (runners/mpi.py): a connection from
outside the job's addresses is closed inside ``accept()``, before the program sees it.

It is preloaded wherever MPI runs, filters or not: one path on bare hosts and in
containers, and it also closes the guard's own window (the 20 ms between a listener
opening and the guard's filter); its cost is one comparison per accepted connection
and the library's load (measured: docs/security.md, "Figures").

Pure: builders of environments, nothing runs here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from training_toolkit.settings import NETSHIM_ALLOW_VAR, NETSHIM_PORTS_VAR

PRELOAD = "LD_PRELOAD"


@dataclass(frozen=True)
class Shim:
    """The built library and the job's hosts' addresses (the list sshd's ``from=`` and the guard admit)."""

    library: str
    allowed: tuple[str, ...]

    def environment(self, ports: range | None = None) -> dict[str, str]:
        """The shim's variables: the job's addresses, and ``ports`` (None: every listener is checked)."""
        if not self.allowed:
            raise ValueError("the accept() shim needs the job's addresses")
        env = {NETSHIM_ALLOW_VAR: ",".join(self.allowed)}
        if ports is not None:
            if len(ports) == 0 or ports.step != 1:
                raise ValueError(f"{ports!r} is not a range of ports")
            env[NETSHIM_PORTS_VAR] = f"{ports.start}-{ports[-1]}"
        return env


def preload_list(user: str | None, ours: Sequence[str]) -> str:
    """``LD_PRELOAD``: the user's libraries first (kept, never replaced), then ours, each once."""
    kept = [p for p in (user or "").replace(" ", ":").split(":") if p and p not in ours]
    return ":".join([*kept, *ours])
