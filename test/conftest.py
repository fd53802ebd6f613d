"""Set-up for every test: the markers and their skip rules (helpers.skips), and shared fixtures.

Helpers live in the ``helpers`` package (``from helpers.jobs import write_job``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import skips


def pytest_configure(config: pytest.Config) -> None:
    for requirement in skips.REQUIREMENTS.values():
        config.addinivalue_line("markers", f"{requirement.marker}: {requirement.description}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose markers ask for what this machine does not have (before its fixtures run)."""
    for name in dict.fromkeys(mark.name for mark in item.iter_markers()):
        reason = skips.why_not(name)
        if reason:
            pytest.skip(reason)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "opt_ml"
