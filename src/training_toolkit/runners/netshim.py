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

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from training_toolkit.config.settings import NETSHIM_ALLOW_VAR, NETSHIM_PORTS_VAR

PRELOAD = "LD_PRELOAD"
_DIGITS = frozenset("0123456789")
_IF_NAMESIZE = 16  # net/if.h: an interface's name and its NUL
_ADDRSTRLEN = 46  # INET6_ADDRSTRLEN
_ENTRY_MAX = _ADDRSTRLEN + _IF_NAMESIZE + 1  # netshim.c's buffer for one entry


def shim_parses(address: str) -> bool:
    """Whether netshim.c's parse_address takes ``address`` as one entry (the same rule, checked against it).

    IPv4 as ``inet_pton`` reads it; IPv6 as ``inet_pton`` reads it, with an optional ``%SCOPE``:
    an interface's index (digits, 1 to 2**32-1) or the name of an interface of this host (as
    ``getaddrinfo`` gives a link-local address: ``fe80::1%eth0``).
    """
    if not address or "," in address or len(address.encode("utf-8", "surrogateescape")) >= _ENTRY_MAX:
        return False
    text, percent, scope = address.partition("%")
    if not percent and _pton(socket.AF_INET, text):
        return True
    if len(text.encode("utf-8", "surrogateescape")) >= _ADDRSTRLEN or not _pton(socket.AF_INET6, text):
        return False
    return not percent or _scope_parses(scope)


def _pton(family: int, text: str) -> bool:
    try:
        socket.inet_pton(family, text)
    except (OSError, ValueError):  # ValueError: a NUL, or a character that is no UTF-8 (a surrogate)
        return False
    return True


def _scope_parses(scope: str) -> bool:
    raw = scope.encode("utf-8", "surrogateescape")
    if not raw or len(raw) >= _IF_NAMESIZE:
        return False
    if scope[0] in _DIGITS:
        return all(c in _DIGITS for c in scope) and 0 < int(scope) < 2**32
    try:
        return socket.if_nametoindex(scope) != 0
    except (OSError, ValueError, UnicodeError):
        return False


@dataclass(frozen=True)
class Shim:
    """The built library and the job's hosts' addresses (the list sshd's ``from=`` and the guard admit)."""

    library: str
    allowed: tuple[str, ...]
    shown_only: bool = False  # ``plan``'s: ``allowed`` is a placeholder, shown as it is

    @property
    def left_out(self) -> tuple[str, ...]:
        """The addresses the library could not parse (an interface gone since it was resolved): never handed to it."""
        return () if self.shown_only else tuple(a for a in self.allowed if not shim_parses(a))

    def environment(self, ports: range | None = None) -> dict[str, str]:
        """The shim's variables: the job's addresses it parses, and ``ports`` (None: every listener is checked)."""
        kept = [a for a in self.allowed if a not in self.left_out]
        if not kept:
            raise ValueError("the accept() shim needs the job's addresses")
        env = {NETSHIM_ALLOW_VAR: ",".join(kept)}
        if ports is not None:
            if len(ports) == 0 or ports.step != 1:
                raise ValueError(f"{ports!r} is not a range of ports")
            env[NETSHIM_PORTS_VAR] = f"{ports.start}-{ports[-1]}"
        return env


def preload_list(user: str | None, ours: Sequence[str]) -> str:
    """``LD_PRELOAD``: the user's libraries first (kept, never replaced), then ours, each once."""
    kept = [p for p in (user or "").replace(" ", ":").split(":") if p and p not in ours]
    return ":".join([*kept, *ours])
