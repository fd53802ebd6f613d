"""A local cluster's names and addresses, and the arguments refused before anything is made."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from training_toolkit.core.errors import ConfigError
from training_toolkit.local import layout
from training_toolkit.local.netns import NamespaceCluster

NAMES = ("algo-1", "algo-2", "algo-3")


@pytest.mark.parametrize(
    ("names", "kwargs", "message"),
    [
        ((), {}, "names: at least one host"),
        (("algo-1", "algo-1"), {}, "names: duplicate"),
        (("algo_1",), {}, "names: 'algo_1' is not a valid hostname"),
        (("hosts",), {}, "names: 'hosts' is reserved"),
        (NAMES, {"subnet": "10.0.0.0/24"}, "subnet: 10.0.0.0/24 is not inside a documentation range"),
        (NAMES, {"subnet": "192.0.2.0/29"}, "subnet: 192.0.2.0/29 is too small"),
        (NAMES, {"subnet": "192.0.2.300/24"}, "subnet: "),
        (NAMES, {"tag": "-x"}, "tag: '-x' must be"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_is_made(
    tmp_path: Path, names: tuple[str, ...], kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^local cluster: {message}"):
        NamespaceCluster(names, tmp_path, **kwargs)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_hosts_get_addresses_from_the_eleventh_on_and_one_hosts_file():
    network = ipaddress.ip_network("198.51.100.0/24")
    addresses = layout.host_addresses(network, 2)
    assert addresses == ("198.51.100.11", "198.51.100.12")
    assert layout.hosts_file_text(("algo-1", "algo-2"), addresses).splitlines()[-2:] == [
        "198.51.100.11\talgo-1", "198.51.100.12\talgo-2"]


def test_every_cluster_gets_a_tag_of_its_own():
    assert layout.new_tag() != layout.new_tag()
