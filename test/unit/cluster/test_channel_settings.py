"""What the control channel reads of the settings: its port and clocks, and the job secret (only the platform's)."""

import pytest

from training_toolkit.cluster.membership import ChannelSettings
from training_toolkit.core.errors import ConfigError
from training_toolkit.config.settings import parse


def test_the_secret_is_the_one_settings_read():
    """The old toolkit derived one from the job name and hosts, which anyone could compute: none is made up."""
    assert parse({}).job_secret is None
    assert parse({"TRAINING_TOOLKIT_JOB_SECRET": "e" * 32}).job_secret == b"e" * 32


def test_channel_settings_come_from_the_settings():
    assert ChannelSettings.from_settings(parse({})) == ChannelSettings(8950, 180.0, 1.0, 10.0)
    env = {"TRAINING_TOOLKIT_CONTROL_PORT": "9000", "TRAINING_TOOLKIT_JOIN_TIMEOUT": "5",
           "TRAINING_TOOLKIT_HEARTBEAT": "0.5", "TRAINING_TOOLKIT_PEER_TIMEOUT": "3"}
    assert ChannelSettings.from_settings(parse(env)) == ChannelSettings(9000, 5.0, 0.5, 3.0)
    with pytest.raises(ConfigError, match="^environment variable TRAINING_TOOLKIT_CONTROL_PORT: expected a port"):
        parse({"TRAINING_TOOLKIT_CONTROL_PORT": "70000"})
