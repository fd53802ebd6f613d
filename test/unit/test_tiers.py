"""The rule that gives every test its tier (helpers/tiers.py), and the guard that keeps ``pure`` pure."""

from __future__ import annotations

import subprocess

import pytest

from helpers import tiers


@pytest.mark.parametrize(("path", "markers", "expected"), [
    ("test/unit/job/test_plan.py", [], "pure"),
    ("test/unit/test_native.py", ["process"], "process"),  # a module's own tier wins
    ("test/integration/runners/test_single.py", [], "process"),
    ("test/integration/test_code.py", ["moto"], "process"),
    ("test/integration/runners/test_mpi.py", ["root", "mpi", "sshd"], "cluster"),
    ("test/integration/platforms/test_slurm.py", ["root", "slurm"], "slurm"),
    ("test/integration/containers/test_local_image.py", ["root", "containers"], "containers"),
    ("test/integration/local/test_cli.py", ["root", "cluster"], "cluster"),
])
def test_every_test_gets_the_tier_of_the_rule(path, markers, expected):
    assert tiers.tier(path, markers) == expected


@pytest.mark.parametrize(("tier", "markers", "expected"), [
    ("pure", [], None), ("cluster", ["root"], None), ("process", [], "process"), ("slurm", ["root", "slurm"], None),
    ("containers", ["containers"], "containers"),
    ("cluster", ["root", "whole_machine"], "containers"),  # reads the root namespace's links, which the engine changes
])
def test_the_tests_that_share_something_of_the_machine_get_one_group(tier, markers, expected):
    assert tiers.group(tier, markers) == expected


def test_two_tiers_for_one_test_is_an_error_that_names_them():
    with pytest.raises(ValueError, match=r"test/unit/x.py: more than one tier: \['process', 'pure'\]"):
        tiers.tier("test/unit/x.py", ["pure", "process"])


def test_every_tier_is_ordered_and_the_ones_run_one_after_another_are_tiers():
    assert sorted(tiers.ORDER) == sorted(tiers.TIERS)
    assert set(tiers.ONE_AFTER_ANOTHER) <= set(tiers.TIERS) and "pure" not in tiers.ONE_AFTER_ANOTHER


def test_this_test_is_pure_and_may_not_start_a_process(request):
    assert request.node.get_closest_marker("pure") is not None
    with pytest.raises(AssertionError, match="a test of tier pure started a process"):
        subprocess.run(["true"], check=False)
