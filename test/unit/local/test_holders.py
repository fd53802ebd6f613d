"""How a command enters a host: the nsenter line, pure."""

from __future__ import annotations

from pathlib import Path

from training_toolkit.local.holders import enter_argv, holder_argv


def test_a_command_enters_the_holders_namespaces_and_starts_where_asked_inside():
    assert enter_argv("/usr/bin/nsenter", 42, ["ls", Path("/opt/ml")], "/opt/ml") == [
        "/usr/bin/nsenter", "--target=42", "--net", "--mount", "--uts", "--wdns=/opt/ml", "--", "ls", "/opt/ml"]
    assert enter_argv("nsenter", 42, ["pwd"], None) == ["nsenter", "--target=42", "--net", "--mount", "--uts", "--", "pwd"]


def test_a_holder_enters_its_network_namespace_then_makes_its_own_uts_and_mount_namespaces():
    argv = holder_argv("nsenter", "unshare", Path("/run/netns/t-h1"), "algo-1", Path("/w/algo-1/opt/ml"), Path("/w/hosts"))
    assert argv[:3] == ["nsenter", "--net=/run/netns/t-h1", "--"]
    assert argv[3:9] == ["unshare", "--uts", "--mount", "--propagation", "private", "--"]
    assert argv[-4:] == ["holder", "algo-1", "/w/algo-1/opt/ml", "/w/hosts"]
