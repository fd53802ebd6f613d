"""What a local cluster needs of the machine, named before anything is made (no root needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from training_toolkit.core.errors import ClusterError
from training_toolkit.local.netns import NamespaceCluster

NAMES = ("algo-1", "algo-2")


def test_start_says_it_needs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cluster = NamespaceCluster(NAMES, tmp_path / "wd")
    with pytest.raises(ClusterError, match="needs root"):
        cluster.start()
    assert not (tmp_path / "wd").exists()
    cluster.close()


def test_start_names_missing_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    cluster = NamespaceCluster(NAMES, tmp_path / "wd")
    with pytest.raises(ClusterError, match=r"`ip` \(iproute2\).*`nsenter`.*`unshare`"):
        cluster.start()
    cluster.close()


def test_a_cluster_that_never_started_has_no_hosts_to_run_in(tmp_path: Path) -> None:
    cluster = NamespaceCluster(NAMES, tmp_path / "wd")
    with pytest.raises(ClusterError, match="not running"):
        cluster.command("algo-1", ["true"])
    cluster.close()
    assert not (tmp_path / "wd").exists()
