"""training-toolkit-ssh (native/ssh_agent.c), Open MPI's rsh agent on every host: ssh with its host's config, or a clear no."""

from __future__ import annotations

import pytest
import subprocess

from training_toolkit import native
from training_toolkit.config.settings import SSH_CONFIG_VAR

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

AGENT = str(native.path_of(native.SSH_AGENT_PROGRAM))


def fake_ssh(tmp_path):
    """An ``ssh`` first on PATH that prints its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    (bin_dir / "ssh").chmod(0o755)
    return str(bin_dir)


def test_it_runs_ssh_with_this_hosts_config_and_every_argument_as_given(tmp_path):
    out = subprocess.run([AGENT, "-x", "algo-2", "orted --arg 'a b'", ""], capture_output=True, text=True, timeout=10,
                         env={"PATH": fake_ssh(tmp_path), SSH_CONFIG_VAR: "/run/tt-ssh-x/ssh_config"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["-F", "/run/tt-ssh-x/ssh_config", "-x", "algo-2", "orted --arg 'a b'", "", ""]


def test_without_the_variable_it_says_so_and_runs_nothing(tmp_path):
    for env in ({}, {SSH_CONFIG_VAR: ""}, {SSH_CONFIG_VAR: "relative/ssh_config"}):
        out = subprocess.run([AGENT, "algo-2", "true"], capture_output=True, text=True, timeout=10,
                             env={"PATH": fake_ssh(tmp_path) if not env else str(tmp_path / "bin"), **env})
        assert out.returncode == 255 and out.stdout == ""
        assert out.stderr.startswith(f"training-toolkit-ssh: {SSH_CONFIG_VAR} is "), out.stderr


def test_no_ssh_on_path_is_said(tmp_path):
    out = subprocess.run([AGENT, "algo-2", "true"], capture_output=True, text=True, timeout=10,
                         env={"PATH": str(tmp_path), SSH_CONFIG_VAR: "/x/ssh_config"})
    assert out.returncode == 255
    assert out.stderr == "training-toolkit-ssh: cannot run ssh: No such file or directory\n"
