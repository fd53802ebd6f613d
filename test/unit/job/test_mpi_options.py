"""sagemaker_mpi_custom_mpi_options as the reference reads them: --NCCL_DEBUG out, -x out, the rest to mpirun."""

from __future__ import annotations

import pytest

from training_toolkit.core.errors import ConfigError
from training_toolkit.job.mpi_options import CustomMpiOptions, parse_custom_options

KEY = "sagemaker_mpi_custom_mpi_options"


def parse(text):
    return parse_custom_options(text, "hp.json", KEY)


def test_the_sdks_documented_example():
    assert parse("--NCCL_DEBUG=WARN -x MY_VAR=on") == CustomMpiOptions((), "WARN", (("MY_VAR", "on"),))


def test_every_form_and_order_kept_for_mpirun():
    assert parse("--mca btl_tcp_eager_limit 1024 --NCCL_DEBUG INFO -x A -x B='b c' --bind-to core --NCCL_DEBUG=TRACE") == \
        CustomMpiOptions(("--mca", "btl_tcp_eager_limit", "1024", "--bind-to", "core"), "TRACE",
                         (("A", None), ("B", "b c")))
    assert parse("") == CustomMpiOptions()
    assert parse("--x C=1 --display-map") == CustomMpiOptions(("--display-map",), None, (("C", "1"),))
    assert parse("-x D==x") == CustomMpiOptions((), None, (("D", "=x"),))


def test_never_a_shell():
    assert parse("-x A=1; rm -rf /").mpirun_args == ("rm", "-rf", "/")
    assert parse("$(id) `id`").mpirun_args == ("$(id)", "`id`")


@pytest.mark.parametrize("text, message", [
    ("--NCCL_DEBUG", "--NCCL_DEBUG needs a value"),
    ("--NCCL_DEBUG --mca x 1", "--NCCL_DEBUG needs a value"),
    ("-x", "-x needs NAME or NAME=VALUE"),
    ("-x BAD-NAME=1", "'BAD-NAME' is not a variable name"),
    ("-x =1", "'' is not a variable name"),
    ("-x 'unbalanced", "cannot be parsed: No closing quotation"),
    (3, "expected a string"),
])
def test_bad_options_name_the_key_and_the_word(text, message):
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert f"hp.json: {KEY}: " in str(info.value) and message in str(info.value)
