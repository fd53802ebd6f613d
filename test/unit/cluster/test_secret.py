from pathlib import Path

import pytest

from training_toolkit.cluster.membership import ChannelSettings
from training_toolkit.cluster.secret import job_secret
from training_toolkit.errors import ConfigError
from training_toolkit.hardware import Hardware
from training_toolkit.job import build_job
from training_toolkit.paths import Paths
from training_toolkit.settings import parse


def job(tmp_path: Path, hosts=("algo-1", "algo-2"), name='"job-1"', current=None):
    rc = {"current_host": current or hosts[0], "hosts": list(hosts)}
    return build_job(Paths(tmp_path), {"sagemaker_job_name": name}, rc, {}, {}, Hardware(1, 0, 0))


def test_secret_from_the_environment_wins(tmp_path):
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "job_secret").write_text("f" * 40)
    assert job_secret(job(tmp_path), {"TRAINING_TOOLKIT_JOB_SECRET": "e" * 32}) == b"e" * 32


def test_secret_from_a_mounted_file(tmp_path):
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "job_secret").write_text("f" * 40 + "\n")
    assert job_secret(job(tmp_path), {}) == b"f" * 40


def test_without_a_platform_secret_none_is_made_up(tmp_path):
    """The old toolkit derived one from the job name and hosts, which anyone could compute."""
    assert job_secret(job(tmp_path), {}) is None
    assert job_secret(job(tmp_path), {"TRAINING_TOOLKIT_JOB_SECRET": ""}) is None


def test_short_secrets_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_JOB_SECRET: the job secret must be at least 16 bytes"):
        job_secret(job(tmp_path), {"TRAINING_TOOLKIT_JOB_SECRET": "short"})


def test_channel_settings_come_from_the_settings():
    assert ChannelSettings.from_settings(parse({})) == ChannelSettings(8950, 180.0, 1.0, 10.0)
    env = {"TRAINING_TOOLKIT_CONTROL_PORT": "9000", "TRAINING_TOOLKIT_JOIN_TIMEOUT": "5",
           "TRAINING_TOOLKIT_HEARTBEAT": "0.5", "TRAINING_TOOLKIT_PEER_TIMEOUT": "3"}
    assert ChannelSettings.from_settings(parse(env)) == ChannelSettings(9000, 5.0, 0.5, 3.0)
    with pytest.raises(ConfigError, match="^environment variable TRAINING_TOOLKIT_CONTROL_PORT: expected a port"):
        parse({"TRAINING_TOOLKIT_CONTROL_PORT": "70000"})
