"""This process's limits, raised where a job needs more than a container starts with.

The lead holds a socket per host (the control channel), and its mpirun
an ssh session per host: about 1,000 open files for 1,000 hosts, past the soft
limit of 1,024 that many containers start with (the hard limit is usually far
higher).  Past the soft limit, accept() fails and the hosts past it can never
join.  Raising the soft limit up to the hard one is what an unprivileged
process may do (Go's runtime does it at every start); children (mpirun, ssh)
inherit it.  The toolkit polls with poll/epoll, never select(), so descriptors
above 1,023 are safe.
"""

from __future__ import annotations

import resource

#: Open files per host a lead may need: the channel's socket, mpirun's ssh session (three
#: pipes) and its ssh connection's master, with room to spare.
FILES_PER_HOST = 8
FILES_BASE = 256


def open_files_needed(hosts: int) -> int:
    return FILES_BASE + FILES_PER_HOST * hosts


def soft_limit_for(soft: int, hard: int, needed: int) -> int:
    """The soft limit to set: ``needed`` if the hard limit allows, else as far as it does; never lower."""
    if hard == resource.RLIM_INFINITY:
        return max(soft, needed)
    return max(soft, min(needed, hard))


def raise_open_files(needed: int) -> tuple[int, int]:
    """Raise the soft limit of open files toward ``needed``; returns (the soft limit now, the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = soft_limit_for(soft, hard, needed)
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target, hard
