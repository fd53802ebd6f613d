"""The job's control channel: the first host serves, the others join.

It gives every runner three things: a readiness barrier with a deadline that
names the hosts that never came, a way for any host to report a failure, and
the job's verdict sent from the first host to all the others, so that every
host ends within a second of the job, and within seconds of any failure.

The wire format and its keys are in ``wire``; who may join is decided by
``admission`` (by the job's secret, or by address where the platform gives
none).  A join carries each host's introduction (e.g. its ssh host key) and
the first host's answer (the job's id, the client key), so a job needs no
shared secret to set up ssh.  Both sides send a heartbeat every
``heartbeat_s``; silence for ``timeout_s`` (or a closed connection) means the
peer is gone.  See docs/security.md for what this stops and what it does not.
"""

from __future__ import annotations

from training_toolkit.cluster.client import ControlClient
from training_toolkit.cluster.events import MAX_REPORT_AGE_S, PeerDone, PeerFailed, PeerLost, Verdict, reported_time
from training_toolkit.cluster.server import ControlServer
from training_toolkit.cluster.timing import HANDSHAKE_TIMEOUT_S, HEARTBEAT_S, TIMEOUT_S

__all__ = ["ControlClient", "ControlServer", "PeerDone", "PeerFailed", "PeerLost", "Verdict", "reported_time",
           "MAX_REPORT_AGE_S", "HANDSHAKE_TIMEOUT_S", "HEARTBEAT_S", "TIMEOUT_S"]
