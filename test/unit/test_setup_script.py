"""scripts/setup.sh: the example's minimal install asks for no Slurm or database; the full test set-up keeps them."""

from __future__ import annotations

import pytest
import os
import subprocess
from pathlib import Path

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"
TEST_ONLY = {"slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server", "cmake", "g++", "make"}
EXAMPLE = {"python3-dev", "python3-venv", "openmpi-bin", "libopenmpi-dev", "openssh-server", "iproute2", "util-linux",
           "gcc"}


def packages(**env: str) -> set[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SETUP_MINIMAL"}
    out = subprocess.run(["bash", str(SETUP)], env={**environ, "SETUP_LIST_PACKAGES": "1", **env},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return set(out.split())


def test_the_minimal_install_has_what_the_example_needs_and_nothing_of_slurm():
    minimal = packages(SETUP_MINIMAL="1")
    assert EXAMPLE <= minimal
    assert not minimal & TEST_ONLY


def test_the_full_set_up_keeps_slurm_and_its_database():
    assert EXAMPLE | TEST_ONLY <= packages()
