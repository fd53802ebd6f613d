"""The control channel's clocks: heartbeats, silence, the join's deadline."""

from __future__ import annotations

from training_toolkit.names import HEARTBEAT_S, PEER_TIMEOUT_S

# The defaults of the settings TRAINING_TOOLKIT_HEARTBEAT and TRAINING_TOOLKIT_PEER_TIMEOUT (names.py holds them,
# for the settings' table too): what a channel made without Settings uses (membership passes the settings').
TIMEOUT_S = PEER_TIMEOUT_S
__all__ = ["HANDSHAKE_TIMEOUT_S", "HEARTBEAT_S", "JOIN_ATTEMPT_S", "TIMEOUT_S"]
HANDSHAKE_TIMEOUT_S = 5.0  # from accept to a seated host; a join that takes longer is dropped
# How long a joining host waits for its welcome before it tries again: longer than the first host's
# own deadline, so the first host always decides first (a host that gave up just as the first host
# seated it found its seat taken; 1,000 hosts joining at once).
JOIN_ATTEMPT_S = HANDSHAKE_TIMEOUT_S + 2.0
