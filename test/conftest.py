"""Set-up for every test: the markers and their skip rules (helpers.skips), each test's tier (helpers.tiers), and
shared fixtures.

Helpers live in the ``helpers`` package (``from helpers.jobs import write_job``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import skips, tiers

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    for requirement in skips.REQUIREMENTS.values():
        config.addinivalue_line("markers", f"{requirement.marker}: {requirement.description}")
    for name, description in tiers.TIERS.items():
        config.addinivalue_line("markers", f"{name}: tier: {description}")
    config.addinivalue_line("markers", f"{tiers.WHOLE_MACHINE}: reads what the whole machine holds (helpers.tiers)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's tier as its marker (and its xdist group where its tier runs one test after another); tests in
    the order of ``tiers.ORDER``, the file's own order kept within a tier."""
    found = {}
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        markers = [mark.name for mark in item.iter_markers()]
        found[item.nodeid] = name = tiers.tier(path, markers)
        item.add_marker(name)
        if (group := tiers.group(name, markers)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: tiers.ORDER.index(found[item.nodeid]))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """In an xdist worker with ``--dist loadgroup``: refuse the run if the groups did not take (the test id carries
    its group after an ``@``), rather than run the tiers that share the machine side by side."""
    if session.config.getoption("loadgroup", default=False):
        lost = [item.nodeid for item in session.items
                if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist's groups did not take (pytest {pytest.__version__}; setup.cfg "
                                    f"says which pytest works): {lost[0]} ...")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose markers ask for what this machine does not have (before its fixtures run)."""
    for name in dict.fromkeys(mark.name for mark in item.iter_markers()):
        reason = skips.why_not(name)
        if reason:
            pytest.skip(reason)


@pytest.fixture(autouse=True)
def pure_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test of tier ``pure`` that starts a process fails, naming what to do (helpers.tiers)."""
    if request.node.get_closest_marker("pure") is not None:
        def refused(*args, **kwargs):
            raise AssertionError("a test of tier pure started a process: give its module "
                                 "`pytestmark = pytest.mark.process` (test/helpers/tiers.py)")

        monkeypatch.setattr(subprocess.Popen, "_execute_child", refused)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve"):
            if hasattr(os, name):
                monkeypatch.setattr(os, name, refused)
    yield


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "opt_ml"
