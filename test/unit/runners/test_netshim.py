"""The accept() shim: its address rule exactly (the built library's own function), and what each process is told."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from training_toolkit import native
from training_toolkit.cluster.ssh.config import render_sshd_config
from training_toolkit.cluster.ssh.errors import SshLayoutError
from training_toolkit.runners.netshim import Shim, preload_list

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

JOB = "10.0.0.2,10.0.0.3,2001:db8::5"


@pytest.fixture(scope="module")
def library():
    lib = ctypes.CDLL(str(native.path_of(native.NETSHIM_LIBRARY)))
    lib.training_toolkit_netshim_admits.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.training_toolkit_netshim_valid.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    return lib


def admits(lib, allow, ports, peer, port=4000):
    encode = (lambda text: None if text is None else text.encode())
    return lib.training_toolkit_netshim_admits(encode(allow), encode(ports), encode(peer), port)


@pytest.mark.parametrize(("peer", "expected"), [
    ("10.0.0.2", 1), ("10.0.0.3", 1), ("2001:db8::5", 1),  # the job's hosts
    ("::ffff:10.0.0.3", 1),  # a host's IPv4 as a dual-stack listener reports it
    ("127.0.0.1", 1), ("127.5.6.7", 1), ("::1", 1), ("::ffff:127.0.0.1", 1),  # loopback: this host
    ("10.0.0.4", 0), ("10.0.0.20", 0), ("0.0.0.0", 0), ("2001:db8::6", 0), ("::ffff:10.0.0.4", 0),
    ("fe80::1", 0),  # a host's IPv6 link-local address is not one of the job's (as for the guard)
    ("::10.0.0.2", 0),  # IPv4-compatible is not IPv4-mapped
])
def test_only_the_jobs_addresses_and_loopback_are_admitted(library, peer, expected):
    assert admits(library, JOB, None, peer) == expected


def test_without_its_variable_the_library_lets_everything_through(library):
    assert admits(library, None, None, "203.0.113.9") == 1
    assert admits(library, None, "31000-31999", "203.0.113.9", 31000) == 1


def test_with_ports_only_those_listeners_are_checked(library):
    for port, expected in [(30999, 1), (31000, 0), (31500, 0), (31999, 0), (32000, 1), (8080, 1)]:
        assert admits(library, JOB, "31000-31999", "203.0.113.9", port) == expected, port
    assert admits(library, JOB, "31000-31999", "10.0.0.2", 31000) == 1
    assert admits(library, JOB, "31000-31999", "203.0.113.9", -1) == 0  # the listener's port unknown: checked


@pytest.mark.parametrize("ports", ["", "31000", "0-10", "1-65536", "200-100", "a-b", "-5", "1-2-3", "123456-1"])
def test_a_bad_port_range_admits_loopback_only_on_every_port(library, ports):
    assert library.training_toolkit_netshim_valid(JOB.encode(), ports.encode()) == -1
    assert admits(library, JOB, ports, "127.0.0.1", 8080) == 1
    assert admits(library, JOB, ports, "::1", 31000) == 1
    assert admits(library, JOB, ports, "10.0.0.2", 8080) == 0  # never an outsider, nor a host: the job fails loudly
    assert admits(library, JOB, ports, "203.0.113.9", 8080) == 0


@pytest.mark.parametrize(("allow", "skipped"), [
    ("10.0.0.2,", 1), (",10.0.0.2", 1), ("10.0.0.2,,10.0.0.3", 1), ("10.0.0.2 ,10.0.0.3", 1),
    ("algo-2,10.0.0.2", 1), ("10.0.0.256,10.0.0.2", 1), ("10.0.0.0/24,10.0.0.2", 1), ("x" * 100 + ",10.0.0.2", 1),
    ("fe80::1%no-such-if0,10.0.0.2", 1), ("10.0.0.2%lo,10.0.0.2", 1), ("fe80::1%,10.0.0.2", 1),
    ("fe80::1%0,10.0.0.2", 1), ("fe80::1%4294967296,10.0.0.2", 1), ("fe80::1%1x,10.0.0.2", 1),
    ("fe80::1%" + "l" * 16 + ",10.0.0.2", 1), ("", 1), (",", 2),
])
def test_an_entry_that_is_no_address_is_left_out_and_the_rest_still_admitted(library, allow, skipped):
    """One odd address used to make every guarded port loopback-only and fail the job."""
    assert library.training_toolkit_netshim_valid(allow.encode(), None) == skipped
    assert admits(library, allow, None, "127.0.0.1", 8080) == 1
    assert admits(library, allow, None, "203.0.113.9", 8080) == 0
    assert admits(library, allow, None, "10.0.0.2", 8080) == (1 if "10.0.0.2" in allow.split(",") else 0)


@pytest.mark.parametrize(("allow", "peer", "expected"), [
    ("fe80::1%lo,10.0.0.2", "fe80::1%lo", 1),  # what getaddrinfo gives for a link-local address
    ("fe80::1%lo", "fe80::1%1", 1),  # lo is interface 1
    ("fe80::1%1", "fe80::1%lo", 1),
    ("fe80::1%lo", "fe80::1%2", 0),  # the same address on another link is another host
    ("fe80::1%lo", "fe80::2%lo", 0),
    ("fe80::1", "fe80::1%7", 1),  # no scope: any link
    ("2001:db8::5%lo", "2001:db8::5", 1),  # a global address's scope cannot narrow it: the kernel gives none
    ("fe80::1%lo", "10.0.0.2", 0),
])
def test_a_scoped_address_is_parsed_and_admits_its_link(library, allow, peer, expected):
    assert library.training_toolkit_netshim_valid(allow.encode(), None) == 0
    assert admits(library, allow, "31000-31999", peer, 31000) == expected


def test_good_variables_are_valid(library):
    assert library.training_toolkit_netshim_valid(JOB.encode(), b"1-65535") == 0
    assert library.training_toolkit_netshim_valid(b"10.0.0.2", None) == 0
    assert library.training_toolkit_netshim_valid(None, None) == 0
    assert admits(library, JOB, None, "not an address") == -1


def test_what_each_process_is_told():
    shim = Shim("/v/native/libtrainingtoolkit_netshim.so", ("10.0.0.2", "10.0.0.3"))
    assert shim.environment() == {"TRAINING_TOOLKIT_NETSHIM_ALLOW": "10.0.0.2,10.0.0.3"}
    assert shim.environment(range(31000, 32000)) == {"TRAINING_TOOLKIT_NETSHIM_ALLOW": "10.0.0.2,10.0.0.3",
                                                     "TRAINING_TOOLKIT_NETSHIM_PORTS": "31000-31999"}
    with pytest.raises(ValueError):
        shim.environment(range(5, 5))
    with pytest.raises(ValueError):
        Shim("/s.so", ()).environment()


def test_the_library_is_handed_only_addresses_it_parses():
    shim = Shim("/s.so", ("10.0.0.2", "fe80::1%lo", "fe80::1%no-such-if0", "algo-2"))
    assert shim.left_out == ("fe80::1%no-such-if0", "algo-2")
    assert shim.environment() == {"TRAINING_TOOLKIT_NETSHIM_ALLOW": "10.0.0.2,fe80::1%lo"}
    with pytest.raises(ValueError):
        Shim("/s.so", ("algo-2",)).environment()
    plan = Shim("/s.so", ("ADDRESSES",), shown_only=True)  # training-toolkit plan's placeholder, shown as it is
    assert (plan.left_out, plan.environment()) == ((), {"TRAINING_TOOLKIT_NETSHIM_ALLOW": "ADDRESSES"})


def test_the_preload_list_keeps_the_users_libraries_first_and_each_once():
    assert preload_list(None, ["/h.so", "/s.so"]) == "/h.so:/s.so"
    assert preload_list("/a.so /b.so:/s.so", ["/h.so", "/s.so"]) == "/a.so:/b.so:/h.so:/s.so"
    assert preload_list("", []) == ""


def sshd_config(**session):
    return render_sshd_config(host_key=Path("/d/host_key"), authorized_keys=Path("/d/ak"), pid_file=Path("/d/pid"),
                              port=22, user="root", session_env=session)


def test_the_daemons_get_the_shim_through_sshds_own_setenv():
    """One SetEnv line: sshd keeps the first SetEnv directive only (a second line's variables never reached a session)."""
    text = sshd_config(LD_PRELOAD="/v/libtrainingtoolkit_netshim.so", TRAINING_TOOLKIT_NETSHIM_ALLOW="10.0.0.2,10.0.0.3")
    assert text.endswith("SetEnv SHLVL=1 ZDOTDIR=/d LD_PRELOAD=/v/libtrainingtoolkit_netshim.so "
                         "TRAINING_TOOLKIT_NETSHIM_ALLOW=10.0.0.2,10.0.0.3\n")
    assert text.count("SetEnv") == 1
    assert sshd_config().endswith("SetEnv SHLVL=1 ZDOTDIR=/d\n")


@pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="needs openssh-server's sshd")
def test_sshd_itself_reads_every_session_variable(tmp_path):
    """``sshd -T`` prints the variables sshd will set: all of them, not the first line's alone."""
    import subprocess

    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    config = tmp_path / "sshd_config"
    config.write_text(render_sshd_config(host_key=key, authorized_keys=tmp_path / "ak", pid_file=tmp_path / "pid",
                                         port=2222, user="root", session_env={"LD_PRELOAD": "/v/s.so", "A_B": "1,2"}))
    out = subprocess.run(["/usr/sbin/sshd", "-T", "-f", str(config)], capture_output=True, text=True, check=True).stdout
    assert [line for line in out.splitlines() if line.startswith("setenv")] == [
        "setenv SHLVL=1", f"setenv ZDOTDIR={tmp_path}", "setenv LD_PRELOAD=/v/s.so", "setenv A_B=1,2"]


@pytest.mark.parametrize("session", [{"LD_PRELOAD": "/a b/s.so"}, {"LD_PRELOAD": '/a"/s.so'}, {"X": "a#b"},
                                     {"A=B": "1"}, {"A B": "1"}, {"X": "a\nPermitTTY yes"}])
def test_a_value_sshd_would_misread_is_refused(session):
    with pytest.raises(SshLayoutError):
        sshd_config(**session)
