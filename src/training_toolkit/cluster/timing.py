"""The control channel's clocks: heartbeats, silence, the join's deadline."""

from __future__ import annotations

from training_toolkit import settings

# The defaults are the settings' (TRAINING_TOOLKIT_HEARTBEAT, TRAINING_TOOLKIT_PEER_TIMEOUT): one table.
HEARTBEAT_S: float = settings.default("heartbeat_s")
TIMEOUT_S: float = settings.default("peer_timeout_s")
HANDSHAKE_TIMEOUT_S = 5.0  # from accept to a seated host; a join that takes longer is dropped
# How long a joining host waits for its welcome before it tries again: longer than the first host's
# own deadline, so the first host always decides first (a host that gave up just as the first host
# seated it found its seat taken; 1,000 hosts joining at once).
JOIN_ATTEMPT_S = HANDSHAKE_TIMEOUT_S + 2.0
