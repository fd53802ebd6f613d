from pathlib import Path

import pytest

from training_toolkit.cluster.membership import ChannelSettings
from training_toolkit.cluster.secret import job_secret
from training_toolkit.errors import ConfigError
from training_toolkit.hardware import Hardware
from training_toolkit.job import build_job
from training_toolkit.paths import Paths


def job(tmp_path: Path, hosts=("algo-1", "algo-2"), name='"job-1"', current=None):
    rc = {"current_host": current or hosts[0], "hosts": list(hosts)}
    return build_job(Paths(tmp_path), {"sagemaker_job_name": name}, rc, {}, {}, Hardware(1, 0, 0))


def test_secret_from_the_environment_wins(tmp_path):
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "job_secret").write_text("f" * 40)
    secret = job_secret(job(tmp_path), {"TRAINING_TOOLKIT_JOB_SECRET": "e" * 32})
    assert (secret.value, secret.source, secret.derived) == (b"e" * 32, "environment", False)
    assert "e" * 32 not in repr(secret)


def test_secret_from_a_mounted_file(tmp_path):
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "job_secret").write_text("f" * 40 + "\n")
    secret = job_secret(job(tmp_path), {})
    assert (secret.value, secret.source) == (b"f" * 40, "file")


def test_derived_secret_is_the_same_on_every_host_and_differs_per_job(tmp_path):
    a = job_secret(job(tmp_path, hosts=("algo-1", "algo-2")), {})
    b = job_secret(job(tmp_path, current="algo-2"), {})
    assert a.derived and a.value == b.value and len(a.value) == 32
    assert job_secret(job(tmp_path, name='"job-2"'), {}).value != a.value
    assert job_secret(job(tmp_path, hosts=("algo-1", "algo-3")), {}).value != a.value


def test_short_secrets_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_JOB_SECRET: the job secret must be at least 16 bytes"):
        job_secret(job(tmp_path), {"TRAINING_TOOLKIT_JOB_SECRET": "short"})


def test_channel_settings_from_the_environment():
    assert ChannelSettings.from_environ({}) == ChannelSettings(8950, 180.0, 1.0, 10.0)
    env = {"TRAINING_TOOLKIT_CONTROL_PORT": "9000", "TRAINING_TOOLKIT_JOIN_TIMEOUT": "5",
           "TRAINING_TOOLKIT_HEARTBEAT": "0.5", "TRAINING_TOOLKIT_PEER_TIMEOUT": "3"}
    assert ChannelSettings.from_environ(env) == ChannelSettings(9000, 5.0, 0.5, 3.0)
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_CONTROL_PORT: expected a number, got 'x'"):
        ChannelSettings.from_environ({"TRAINING_TOOLKIT_CONTROL_PORT": "x"})
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_JOIN_TIMEOUT: expected a positive number"):
        ChannelSettings.from_environ({"TRAINING_TOOLKIT_JOIN_TIMEOUT": "-1"})
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_CONTROL_PORT: expected a port"):
        ChannelSettings.from_environ({"TRAINING_TOOLKIT_CONTROL_PORT": "70000"})
