"""How the hosts of one job reach each other: the control channel and per-job SSH.

The job's control channel: the lead serves (``server.ControlServer``), the
others join (``client.ControlClient``).  It gives every runner three things: a
readiness barrier with a deadline that names the hosts that never came, a way for
any host to report a failure, and the job's verdict sent from the lead to
all the others (``events``: what a peer's messages become), so that every host
ends within a second of the job, and within seconds of any failure.

The wire format and its keys are in ``wire``; who may join is decided by
``admission`` (by the job's secret, or by address where the platform gives
none).  A join carries each host's introduction (e.g. its ssh host key) and
the lead's answer (the job's id, the client key), so a job needs no
shared secret to set up ssh.  Both sides send a heartbeat every
``timing.HEARTBEAT_S``; silence for ``timing.TIMEOUT_S`` (or a closed connection)
means the peer is gone.  See docs/security.md for what this stops and what it
does not.  Import each name from its own module: this package re-exports nothing.
"""
