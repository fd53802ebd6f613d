"""What a local cluster is called and where its hosts sit on its network; pure, nothing is created.

Layout of one cluster (every namespace is the cluster's own and has no name, so clusters never collide)::

    switch          bridge br0, ports veth1..vethN          (no address; traffic stays inside)
    host 1          eth0 = peer of veth1, address .11, lo
    host 2          eth0 = peer of veth2, address .12, lo

The tag names the cluster in messages and marks the processes that hold it.

Addresses come from a documentation range (RFC 5737), so an address of a test
cluster can never be mistaken for a real machine's.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from training_toolkit.core.errors import ConfigError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Addresses reserved for documentation (RFC 5737): a cluster's subnet must lie inside one.
DOCUMENTATION_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
)
DEFAULT_SUBNET = "192.0.2.0/24"


def host_opt_ml(workdir: Path, host: str) -> Path:
    """Where host ``host``'s ``/opt/ml`` lives on this machine: ``WORKDIR/HOST/opt/ml``, for every local launcher."""
    return workdir / host / "opt" / "ml"

#: Host addresses start at this offset in the subnet (192.0.2.11, .12, ... for a /24), which
#: keeps them recognisable and away from the network and low gateway-like addresses.
FIRST_HOST_OFFSET = 11

#: The file in a cluster's workdir that every host sees as /etc/hosts; no host may take its name.
HOSTS_FILE = "hosts"

_HOSTNAME_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_SOURCE = "local cluster"


def new_tag() -> str:
    """A fresh tag: the name of one cluster."""
    return "tt-" + secrets.token_hex(4)


def validate(names: Sequence[str], network: Network, tag: str) -> None:
    """Reject bad arguments before anything is created, naming the argument at fault."""
    if not names:
        raise ConfigError(_SOURCE, "names", "at least one host is needed")
    for name in names:
        if not isinstance(name, str) or not _HOSTNAME_RE.match(name):
            raise ConfigError(_SOURCE, "names", f"{name!r} is not a valid hostname label")
        if name == HOSTS_FILE:
            raise ConfigError(_SOURCE, "names", f"{HOSTS_FILE!r} is reserved for the shared hosts file in workdir")
    duplicates = sorted({n for n in names if list(names).count(n) > 1})
    if duplicates:
        raise ConfigError(_SOURCE, "names", f"duplicate host names {duplicates}")
    if not any(
        network.version == doc.version and network.subnet_of(doc)  # type: ignore[arg-type]
        for doc in DOCUMENTATION_NETWORKS
    ):
        raise ConfigError(
            _SOURCE, "subnet",
            f"{network} is not inside a documentation range ({', '.join(map(str, DOCUMENTATION_NETWORKS))})",
        )
    if FIRST_HOST_OFFSET + len(names) >= network.num_addresses - 1:
        raise ConfigError(_SOURCE, "subnet", f"{network} is too small for {len(names)} hosts")
    if not _TAG_RE.match(tag):
        raise ConfigError(_SOURCE, "tag", f"{tag!r} must be 1-32 of [A-Za-z0-9_.-], starting alphanumeric")


def parse_subnet(subnet: str) -> Network:
    try:
        return ipaddress.ip_network(subnet)
    except ValueError as exc:
        raise ConfigError(_SOURCE, "subnet", str(exc)) from None


def host_addresses(network: Network, count: int) -> tuple[str, ...]:
    first = int(network.network_address) + FIRST_HOST_OFFSET
    return tuple(str(ipaddress.ip_address(first + i)) for i in range(count))


def hosts_file_text(names: Sequence[str], addresses: Sequence[str]) -> str:
    """/etc/hosts for every host: localhost, then each host by name."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{a}\t{n}" for a, n in zip(addresses, names, strict=True)]
    return "\n".join(lines) + "\n"
