"""What the local launchers take of their caller's environment (pure): the hosts' base, the engine's address."""

from __future__ import annotations

import pytest

from training_toolkit.local import engine
from training_toolkit.local.launcher import base_environment


@pytest.mark.parametrize(("environ", "expected"), [
    ({"PATH": "/opt/bin:/usr/bin", "LANG": "de_DE.UTF-8", "HOME": "/home/u", "SECRET": "x", "DOCKER_HOST": "y"},
     {"PATH": "/opt/bin:/usr/bin", "LANG": "de_DE.UTF-8", "HOME": "/home/u"}),
    ({}, {"PATH": "/bin:/usr/bin", "LANG": "C.UTF-8", "HOME": "/root"}),
])
def test_the_hosts_take_only_path_lang_and_home(environ, expected, monkeypatch):
    monkeypatch.setattr("os.defpath", "/bin:/usr/bin")
    assert base_environment(environ) == expected


@pytest.mark.parametrize(("environ", "url"), [
    ({"DOCKER_HOST": "unix:///run/podman/podman.sock"}, "unix:///run/podman/podman.sock"),
    ({"DOCKER_HOST": ""}, "unix:///var/run/docker.sock"),
    ({}, "unix:///var/run/docker.sock"),
])
def test_the_engine_is_the_one_the_callers_docker_host_names(environ, url):
    assert engine.socket_url(environ) == url


def test_no_engine_is_one_line_naming_the_address(tmp_path):
    pytest.importorskip("docker")
    url = f"unix://{tmp_path}/none.sock"
    with pytest.raises(engine.EngineError, match=f"^no container engine at {url} "):
        engine.connect(url, timeout_s=5)
