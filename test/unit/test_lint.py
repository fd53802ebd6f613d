"""The code passes the project's lint rules (pyproject.toml: pyflakes, bugbear)."""

import subprocess

import pytest

from helpers.paths import REPO, ruff

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)


@pytest.mark.ruff
def test_ruff_finds_nothing():
    result = subprocess.run([ruff(), "check", "--output-format", "concise", "src", "test", "bench"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
