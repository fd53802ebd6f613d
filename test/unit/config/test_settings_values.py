"""The kinds of value a setting may take (settings_values): exact values in, exact values or errors out."""

from __future__ import annotations

import pytest

from training_toolkit.config import settings_values as values

GOOD = [
    (values.seconds, "2.5", 2.5), (values.seconds, "1e-3", 0.001),
    (values.grace, "0", 0.0), (values.grace, "120", 120.0),
    (values.seconds_or_off, "0", None), (values.seconds_or_off, "30", 30.0),
    (values.port, "1", 1), (values.port, "65535", 65535),
    (values.count, "0", 0), (values.count, "12", 12),
    (values.hosts, "1", 1), (values.completions, "4", 4),
    (values.on_off, "ON", True), (values.on_off, "off", False),
    (values.platform, "JobSet", "jobset"), (values.platform, "py-torch_job", "py-torch_job"),
    (values.secret, "s" * 16, b"s" * 16), (values.secret, b"  " + b"f" * 20 + b"\n", b"f" * 20),
    (values.mpi_flavor, "openmpi5", "openmpi5"), (values.mpi_launcher, "slurm", "slurm"),
    (values.key_files, "/keys", values.KeyFiles("/keys")), (values.text, " as given ", " as given "),
]

BAD = [
    (values.seconds, "0", "expected a positive number of seconds"),
    (values.seconds, "-1", "expected a positive number of seconds"),
    (values.seconds, "inf", "expected a positive number of seconds"),
    (values.seconds, "nan", "expected a positive number of seconds"),
    (values.seconds, "ten", "expected a positive number of seconds"),
    (values.grace, "-0.5", "expected a number of seconds, 0 or more"),
    (values.seconds_or_off, "-1", "expected a number of seconds (0: never)"),
    (values.port, "0", "expected a port number (1-65535)"),
    (values.port, "65536", "expected a port number (1-65535)"),
    (values.port, "٨٠", "expected a port number (1-65535)"),  # digits, but not ASCII ones
    (values.count, "-1", "expected a whole number, 0 or more"),
    (values.count, "1.0", "expected a whole number, 0 or more"),
    (values.hosts, "0", "expected a whole number of hosts, 1 or more"),
    (values.completions, "0", "expected a whole number of pods, 1 or more"),
    (values.on_off, "yes", "expected on or off"),
    (values.platform, "9pods", "expected a platform's name"),
    (values.platform, "k8s pod", "expected a platform's name"),
    (values.secret, "s" * 15, "the job secret must be at least 16 bytes"),
    (values.secret, b"f" * 15 + b"\n", "the job secret must be at least 16 bytes"),
    (values.mpi_flavor, "mpich", "expected openmpi4 or openmpi5"),
    (values.mpi_launcher, "rsh", "expected ssh or slurm"),
]


@pytest.mark.parametrize(("parse", "raw", "value"), GOOD)
def test_a_good_value(parse, raw, value):
    assert parse(raw) == value


@pytest.mark.parametrize(("parse", "raw", "message"), BAD)
def test_a_bad_value_says_what_was_expected(parse, raw, message):
    with pytest.raises(ValueError) as caught:
        parse(raw)
    assert str(caught.value).startswith(message)
