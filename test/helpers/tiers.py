"""What a test costs, as one marker per test: its tier (docs/development.md, "Tests in tiers").

Every test gets exactly one tier, by the rule of ``tier``: a tier marker of its own (a module's
``pytestmark``) wins; otherwise what it needs decides (its requirement markers, helpers.skips), and
where it lives.  ``conftest.py`` adds the tier's marker, so ``-m pure`` selects a tier, and puts the
tiers that share something of the machine in one xdist group each, so that ``-n`` runs them one test
after another on one worker while the rest run side by side.

``pure`` is also enforced: a test of that tier that starts a process fails, naming the tier to give it.
"""

from __future__ import annotations

from collections.abc import Iterable

TIERS = {
    "pure": "Python only: no process started, no namespace (the default under test/unit)",
    "process": "starts processes in this machine's own namespaces (train on one host, sshd, mpirun, a compiler); "
               "they may share ports and names, so these run one after another",
    "cluster": "local clusters, each in network namespaces of its own (marker root): side by side",
    "slurm": "a Slurm cluster on namespace hosts (munge, slurmctld, slurmd; each with its own /run, key and files): "
             "side by side",
    "containers": "the container engine, whose container names are global: one after another",
}

#: Tiers whose tests share something of this machine: each runs on one worker, one test after another.
ONE_AFTER_ANOTHER = ("containers", "process")

#: A marker for a test that reads what the whole machine holds (the links of its own network namespace, to see that
#: a job left nothing there): it runs in the containers' group, since the container engine adds links there.
WHOLE_MACHINE = "whole_machine"

#: The order tests start in (the long tiers that run one after another first, so they do not end last).
ORDER = (*ONE_AFTER_ANOTHER, "slurm", "cluster", "pure")


def tier(path: str, markers: Iterable[str]) -> str:
    """The tier of a test at ``path`` (relative to the repository, with '/') with these marker names."""
    names = set(markers)
    own = names & set(TIERS)
    if len(own) > 1:
        raise ValueError(f"{path}: more than one tier: {sorted(own)}")
    if own:
        return own.pop()
    for needed in ("containers", "slurm"):
        if needed in names:
            return needed
    if "root" in names:
        return "cluster"
    return "process" if path.startswith("test/integration/") else "pure"


def group(name: str, markers: Iterable[str]) -> str | None:
    """The xdist group of a test of tier ``name``: the tests of one group run one after another on one worker."""
    if WHOLE_MACHINE in set(markers):
        return "containers"
    return name if name in ONE_AFTER_ANOTHER else None
