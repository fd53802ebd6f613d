"""Open MPI's launch tree as each worker computes it to admit only its launchers (runners/mpi_tree.py): exact tables.

Checked against ORTE's and PRRTE's ``radix_tree`` as read (a daemon at a level of n starts the daemons n, 2n, ...
radix*n places after it) and, end to end, by test/integration/runners/test_tree_spawn.py (radix 2 on 4 hosts:
algo-4's daemon started by algo-2's, for both flavours).
"""

from __future__ import annotations

import pytest

from training_toolkit.runners.mpi_command import MpiJob, mpirun_command
from training_toolkit.runners.mpi_tree import DEFAULT_RADIX, launcher, routed_radix

HOSTS = tuple(f"h{i}" for i in range(16))


@pytest.mark.parametrize("radix, parents", [
    (2, ["h0", "h0", "h1", "h2", "h1", "h2", "h3", "h4", "h5", "h6", "h3", "h4", "h5", "h6", "h7"]),
    (3, ["h0", "h0", "h0", "h1", "h2", "h3", "h1", "h2", "h3", "h1", "h2", "h3", "h4", "h5", "h6"]),
    (64, ["h0"] * 15),  # below radix + 2 hosts: every daemon is mpirun's child
])
def test_each_hosts_launcher(radix, parents):
    assert [launcher(HOSTS, host, radix) for host in HOSTS[1:]] == parents


def test_at_the_default_radix_the_tree_begins_at_66_hosts():
    hosts = tuple(f"h{i}" for i in range(70))
    assert {launcher(hosts, h) for h in hosts[1:65]} == {"h0"}
    assert [launcher(hosts, h) for h in hosts[65:]] == ["h1", "h2", "h3", "h4", "h5"]


def test_mpiruns_own_host_has_no_launcher():
    with pytest.raises(ValueError):
        launcher(HOSTS, "h0")


@pytest.mark.parametrize("args, radix", [
    ((), DEFAULT_RADIX), (("--mca", "routed_radix", "2"), 2), (("--prtemca", "routed_radix", "4"), 4),
    (("--mca", "routed_radix", "2", "-mca", "routed_radix", "8"), 8), (("--mca", "btl", "tcp"), DEFAULT_RADIX),
])
def test_the_radix_is_the_custom_options_last_word_else_the_default(args, radix):
    assert routed_radix(args) == radix


@pytest.mark.parametrize("flavor, custom, radix", [
    ("openmpi4", (), 64),
    ("openmpi4", ("--prtemca", "routed_radix", "2"), 2),  # said again in this flavour's words
    ("openmpi5", ("--mca", "routed_radix", "2"), 2),
    ("openmpi5", ("--prtemca", "routed_radix", "2"), 2),  # the options' own, once
])
def test_mpiruns_line_sets_the_radix_the_workers_compute(flavor, custom, radix):
    job = MpiJob(hosts=("a", "b"), processes_per_host=1, num_processes=2, interface="eth0", rank_command=("r",),
                 rsh_agent=("agent",), custom_options=custom)
    line = mpirun_command(job, flavor)
    setter = "--mca" if flavor == "openmpi4" else "--prtemca"
    said = [(line[i], line[i + 2]) for i in range(len(line) - 2) if line[i + 1] == "routed_radix"]
    assert [s for s in said if s[0] == setter] == [(setter, str(radix))], line
    assert routed_radix(tuple(line)) == radix  # the line's last word is the radix every worker computes
