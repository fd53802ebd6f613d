"""How a host is held and entered: the command lines, pure."""

from __future__ import annotations

from pathlib import Path

from training_toolkit.local.holders import INIT, enter_argv, holder_argv, switch_argv

TOOLS = {"setpriv": "/usr/bin/setpriv", "unshare": "/usr/bin/unshare"}


def test_a_command_enters_every_namespace_of_the_host_and_starts_where_asked_inside():
    assert enter_argv("/usr/bin/nsenter", 42, ["ls", Path("/opt/ml")], "/opt/ml") == [
        "/usr/bin/nsenter", "--target=42", "--net", "--mount", "--uts", "--ipc", "--pid", "--wdns=/opt/ml", "--",
        "ls", "/opt/ml"]
    assert enter_argv("nsenter", 42, ["pwd"], None) == [
        "nsenter", "--target=42", "--net", "--mount", "--uts", "--ipc", "--pid", "--", "pwd"]


def test_a_holder_dies_with_its_launcher_and_forks_the_init_of_a_new_pid_namespace():
    argv = holder_argv(TOOLS, "algo-1", Path("/w/algo-1/opt/ml"), Path("/w/hosts"), "/venv/bin/python")
    # the kernel kills the holder when its launcher dies; unshare passes that on to the init it forks
    assert argv[:4] == ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--"]
    assert argv[4:15] == ["/usr/bin/unshare", "--net", "--uts", "--ipc", "--mount", "--pid", "--kill-child=SIGKILL",
                          "--mount-proc", "--propagation", "private", "--"]
    assert argv[-6:] == ["holder", "algo-1", "/w/algo-1/opt/ml", "/w/hosts", "/venv/bin/python", INIT]


def test_the_switch_holds_only_a_network_namespace_and_dies_with_its_launcher():
    assert switch_argv(TOOLS)[:7] == ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--", "/usr/bin/unshare", "--net", "--"]
