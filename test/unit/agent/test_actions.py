"""How the agent's shell names what it could not do (``agent/actions.py``): pure, exact."""

from __future__ import annotations

import errno

from training_toolkit.agent.actions import ARG_LIMIT, cannot_start, too_long


def test_an_exec_too_big_names_its_longest_argument_or_variable():
    assert ARG_LIMIT == 131072  # Linux's MAX_ARG_STRLEN: 32 pages of 4 KiB
    env = {"SM_HPS": "x" * ARG_LIMIT, "SM_HP_LR": "0.1"}
    assert too_long(["python", "train.py"], env) == (
        f"the variable SM_HPS is {ARG_LIMIT + len('SM_HPS=') + 1:,} bytes, over Linux's limit of 131,072 for one "
        "(a hyperparameter too long?)")
    argv = ["python", "train.py", "--big", "y" * ARG_LIMIT]
    assert too_long(argv, {"SM_HP_LR": "0.1"}).startswith(f"the argument after --big is {ARG_LIMIT + 1:,} bytes")
    assert too_long(["python", "z" * ARG_LIMIT], {}).startswith("argument 1 is")
    # none over the limit: only their sum can be
    assert too_long(["python"], {"A": "b"}) == "the arguments and the environment together are over the system's limit"


def test_a_program_that_cannot_start_is_named_with_the_cause():
    error = OSError(errno.E2BIG, "Argument list too long")
    assert str(cannot_start(["python", "train.py"], True, error, {"SM_HPS": "x" * ARG_LIMIT})).startswith(
        "cannot run python: Argument list too long: the variable SM_HPS is ")
    missing = OSError(errno.ENOENT, "No such file or directory", "/opt/bin/tool")
    assert str(cannot_start(["tool"], False, missing)) == "cannot start /opt/bin/tool: No such file or directory"
