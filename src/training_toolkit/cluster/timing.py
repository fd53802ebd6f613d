"""The control channel's clocks: heartbeats, silence, the join's deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training_toolkit.core.names import HEARTBEAT_S, PEER_TIMEOUT_S
from training_toolkit.core.records import record

if TYPE_CHECKING:
    from training_toolkit.config.settings import Settings

# The defaults of the settings TRAINING_TOOLKIT_HEARTBEAT and TRAINING_TOOLKIT_PEER_TIMEOUT (core/names.py holds them,
# for the settings' table too): what a channel made without Settings uses (membership passes the settings').
TIMEOUT_S = PEER_TIMEOUT_S
__all__ = ["HANDSHAKE_TIMEOUT_S", "HEARTBEAT_S", "JOIN_ATTEMPT_S", "TIMEOUT_S", "ChannelSettings"]
HANDSHAKE_TIMEOUT_S = 5.0  # from accept to a seated host; a join that takes longer is dropped
# How long a joining host waits for its welcome before it tries again: longer than the lead's
# own deadline, so the lead always decides first (a host that gave up just as the lead
# seated it found its seat taken; 1,000 hosts joining at once).
JOIN_ATTEMPT_S = HANDSHAKE_TIMEOUT_S + 2.0


@record
class ChannelSettings:
    """The channel's port and clocks for one job, from the settings."""

    port: int
    join_timeout_s: float
    heartbeat_s: float
    peer_timeout_s: float
    first_attempt: int = 0  # the attempt the job starts at (the platform restarted it: JobSet's restart-attempt)
    verdict_wait_s: float = 10.0  # the lead keeps the verdict this long for hosts not joined yet

    @classmethod
    def from_settings(cls, settings: Settings, first_attempt: int = 0) -> ChannelSettings:
        return cls(settings.control_port, settings.join_timeout_s, settings.heartbeat_s, settings.peer_timeout_s,
                   first_attempt, settings.verdict_wait_s)
