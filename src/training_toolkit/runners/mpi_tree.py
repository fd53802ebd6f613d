"""Open MPI's launch tree: which host's daemon logs in to which, so that each host admits only those that launch there.

Over ssh, Open MPI starts its daemons as a tree (tree spawn) that follows its routing tree,
``routed_radix`` (default 64, Open MPI 4's ``radix`` component and PRRTE's alike): daemon 0 is
mpirun, on the lead; daemon ``i`` is the ``i``-th host of mpirun's ``--host`` list (the attempt's
active hosts, in rank order); a daemon at a level of ``n`` daemons starts the daemons ``n``,
``2n``, ... ``radix * n`` places after it (ORTE's and PRRTE's ``radix_tree``).  So below
``radix + 2`` hosts every daemon is mpirun's child, and every login comes from the lead.

The toolkit sets the radix on mpirun's line itself (``mpirun_command``), the custom options' value
if they give one (``routed_radix``), so that the tree every host computes here is the one mpirun
builds.  Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_RADIX = 64
_SETTERS = ("--mca", "-mca", "--prtemca", "-prtemca")


def routed_radix(mpirun_args: Sequence[str]) -> int:
    """The radix the custom options ask for (``--mca routed_radix N`` or ``--prtemca routed_radix N``, the last one
    given), else the default."""
    radix = DEFAULT_RADIX
    for i, word in enumerate(mpirun_args[:-2]):
        if word in _SETTERS and mpirun_args[i + 1] == "routed_radix" and mpirun_args[i + 2].isdigit():
            radix = max(1, int(mpirun_args[i + 2]))
    return radix


def launcher(hosts: Sequence[str], host: str, radix: int = DEFAULT_RADIX) -> str:
    """The host whose daemon logs in to ``host``'s (``hosts``: mpirun's ``--host`` order, mpirun's host first)."""
    target = list(hosts).index(host)
    if target == 0:
        raise ValueError(f"{host} runs mpirun: no daemon logs in to it")
    level_start, level_size = 0, 1  # the first daemon of a level, and how many daemons the level holds
    while True:
        for parent in range(level_start, min(level_start + level_size, target)):
            for k in range(1, radix + 1):
                child = parent + k * level_size
                if child == target:
                    return hosts[parent]
                if child > target:
                    break
        level_start, level_size = level_start + level_size, level_size * radix
        if level_start > target:
            raise ValueError(f"no daemon launches {host} in a tree of radix {radix}")  # cannot happen: a tree is whole
