"""The control channel's clocks: heartbeats, silence, the join's deadline."""

from __future__ import annotations

from training_toolkit import settings

# The defaults are the settings' (TRAINING_TOOLKIT_HEARTBEAT, TRAINING_TOOLKIT_PEER_TIMEOUT): one table.
HEARTBEAT_S: float = settings.default("heartbeat_s")
TIMEOUT_S: float = settings.default("peer_timeout_s")
HANDSHAKE_TIMEOUT_S = 5.0  # from accept to a seated host; a join that takes longer is dropped
