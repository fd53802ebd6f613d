"""Who may take a seat in the job: the lead's rules for admitting a peer, as plain decisions.

With a platform secret, a peer proves it knows the secret; where it connects
from does not matter.  Without one (as SageMaker starts jobs), a seat is
admitted by address: ``algo-2`` only from an address that the name
``algo-2`` resolves to on the lead (looked up again when a claimant's
address is not among them: a pod replaced under its name has a new one), the
first such claimant wins and keeps the seat (the server lets the same address take it again before the
host said ready: ``ControlServer._handshake``); anything else is refused
before its handshake.  This trusts
the network to deliver packets from the address they claim (an outsider
cannot take over a host's address); docs/security.md says what that does
and does not stop.

Bounds against a flood: at most ``per_address`` handshakes at a time from one
address and ``total`` overall; each handshake has a deadline.  Every refusal
is one log line, the first of each kind per address; repeats are counted and
summarised when the channel closes.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from training_toolkit.cluster.netaddr import plain as _plain, resolve

RESOLVE_EVERY_S = 1.0  # a name that did not resolve (yet) is looked up again at most this often


class Addresses:
    """The addresses of the job's hosts, resolved lazily and looked up again (rate-limited) on a miss."""

    def __init__(self, hosts: Iterable[str], resolver: Callable[[str], frozenset[str]] = resolve,
                 clock: Callable[[], float] = time.monotonic):
        self._hosts = tuple(hosts)
        self._resolver = resolver
        self._clock = clock
        self._known: dict[str, frozenset[str]] = {}
        self._looked: dict[str, float] = {}
        self._lock = threading.Lock()

    def of(self, host: str, address: str | None = None) -> frozenset[str]:
        """The addresses ``host`` resolved to, pinned once found; a name not found yet is looked up at most once a second.

        ``address`` not among the pinned ones (a pod replaced under the same name, with a new address):
        the name is looked up again, at most once a second, and what it resolves to now replaces them.
        """
        with self._lock:
            known = self._known.get(host)
            if known is not None and (address is None or address in known):
                return known
            now = self._clock()
            last = self._looked.get(host)
            if last is None or now - last >= RESOLVE_EVERY_S:
                self._looked[host] = now
                found = self._resolver(host)
                if found:
                    self._known[host] = found
            return self._known.get(host, frozenset())

    def holds(self, address: str) -> bool:
        """Whether ``address`` is one of the job's hosts' (resolving the ones not seen there yet)."""
        address = _plain(address)
        return any(address in self.of(host, address) for host in self._hosts)


class Admission:
    """The lead's rules; ``seat`` and ``check_peer`` return None to admit, else the reason to refuse."""

    def __init__(self, hosts: Iterable[str], *, by_address: bool, addresses: Addresses | None = None,
                 per_address: int = 4, total: int = 64):
        self.hosts = tuple(hosts)
        self.by_address = by_address
        self.addresses = addresses or Addresses(self.hosts)
        self.per_address = per_address
        self.total = max(total, 2 * len(self.hosts))
        self._pending: Counter[str] = Counter()
        self._lock = threading.Lock()

    def enter(self, address: str) -> str | None:
        """At accept, before anything else: a slot for one more handshake from ``address``, or why not."""
        with self._lock:
            if self._pending[address] >= self.per_address:
                return f"more than {self.per_address} joins at once from one address"
            if sum(self._pending.values()) >= self.total:
                return f"more than {self.total} joins at once"
            self._pending[address] += 1
        return None

    def check_peer(self, address: str) -> str | None:
        """Before the handshake (may resolve names): is this address worth a handshake at all?"""
        if self.by_address and not self.addresses.holds(address):
            return "not an address of this job's hosts"
        return None

    def done(self, address: str) -> None:
        """A handshake that ``enter`` let in has ended (either way)."""
        with self._lock:
            self._pending[address] -= 1
            if self._pending[address] <= 0:
                del self._pending[address]

    def seat(self, host: str, address: str, seated: Iterable[str]) -> str | None:
        """After the handshake: may ``host``, connecting from ``address``, take its seat?"""
        if host not in self.hosts:
            return f"{host!r} is not a host of this job"
        if host in seated:
            return f"{host!r} has joined already"
        if self.by_address and _plain(address) not in self.addresses.of(host, _plain(address)):
            return f"{host!r} does not resolve to {address}"
        return None


class RefusalLog:
    """One log line per (address, kind of refusal) the first time; repeats counted, summarised by ``summary``.

    ``kind`` is the reason without what the peer chose (the host name it
    claimed, the bytes it sent): a peer that invents a new name for every
    join still gets one line per address (issue 17).  Without one, the reason is the kind.
    """

    def __init__(self, log: Callable[[str], None]):
        self._log = log
        self._seen: set[tuple[str, str]] = set()
        self._repeats: Counter[str] = Counter()
        self._lock = threading.Lock()

    def refused(self, address: str, reason: str, kind: str | None = None) -> None:
        key = (address, reason if kind is None else kind)
        with self._lock:
            first = key not in self._seen
            if first:
                self._seen.add(key)
            else:
                self._repeats[address] += 1
        if first:
            self._log(f"control channel: refused a connection from {address}: {reason}")

    def summary(self) -> None:
        with self._lock:
            repeats, self._repeats = self._repeats, Counter()
        for address, count in sorted(repeats.items()):
            self._log(f"control channel: refused {count} more connection(s) from {address}")


def may_retake(peer: str, address: str, ready_attempt: int, attempt: int) -> bool:
    """A seated host joining again may take its seat back: from the same address, before it said ready for ``attempt``.

    A host whose welcome came after its own join deadline joins again while its seat is held:
    refused, and the old link's end failed the job (1,000 hosts joining at once).  The same
    proof as any join, from the same address, before any message: nothing said is lost.
    A host whose link is gone (its ``train`` restarted: a container restarted in its pod) needs
    no stale seat: its seat is free, and it takes it by the same rules as any join.
    """
    return peer == address and ready_attempt < attempt
