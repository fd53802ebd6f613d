"""Generated inputs through the built native code itself: the rank file's reader and the shim's address list.

The rank program (native/rank_exec.c) is run for real on files from ``rank_env.encode_rank_file``
and on broken ones; the shim (native/netshim.c) is called through ctypes.  Neither may crash on
anything, valid input makes a round trip, and Python's rule of what the shim parses
(``shim_parses``) is the library's exactly.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from training_toolkit import native
from training_toolkit.runners import rank_env
from training_toolkit.runners.netshim import shim_parses

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

PRINTF = "/usr/bin/printf"
ENV = "/usr/bin/env"
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------------------------------------- rank file

# bytes as the environment holds them (anything but NUL), in Python's form for them (surrogateescape)
raw_text = st.binary(max_size=40).filter(lambda b: b"\0" not in b).map(lambda b: b.decode("utf-8", "surrogateescape"))
any_text = st.one_of(st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=40), raw_text)
# a name the dynamic loader and libc leave alone (LD_*, GLIBC_TUNABLES... would change how env itself runs)
names = any_text.filter(lambda n: "=" not in n).map(lambda n: "X" + n)


def run(program: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([program, str(path)], env={}, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def rank_program() -> str:
    return str(native.path_of(native.RANK_PROGRAM))


@settings(FUZZ, max_examples=150)
@given(argv=st.lists(any_text, min_size=1, max_size=6), env=st.dictionaries(names, any_text, max_size=8),
       cwd_name=any_text.filter(lambda n: "/" not in n and n not in ("", ".", "..")))
def test_a_valid_file_makes_a_round_trip_through_the_rank_program(rank_program, argv, env, cwd_name):
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp, cwd_name)
        cwd.mkdir()
        path = Path(tmp, "rank.env")
        # the command's arguments exactly: printf writes each, NUL-terminated
        path.write_bytes(rank_env.encode_rank_file(str(cwd), [PRINTF, "%s\\0", *argv], env))
        proc = run(rank_program, path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split(b"\0")[:-1] == [os.fsencode(a) for a in argv]
        # the environment exactly: the file's, PWD the rank's directory (nothing inherited: env={})
        path.unlink()
        path.write_bytes(rank_env.encode_rank_file(str(cwd), [ENV, "-0"], env))
        proc = run(rank_program, path)
        assert proc.returncode == 0, proc.stderr
        seen = dict(entry.split(b"=", 1) for entry in proc.stdout.split(b"\0")[:-1])
        assert seen.pop(b"TRAINING_TOOLKIT_RANK_PID").isdigit()  # the rank's own pid (the file's is left out)
        assert seen.pop(b"TRAINING_TOOLKIT_RANK_PARENT").isdigit()  # and its parent's, the rank program's
        given = {os.fsencode(k): os.fsencode(v) for k, v in env.items()
                 if k not in ("TRAINING_TOOLKIT_RANK_PID", "TRAINING_TOOLKIT_RANK_PARENT")}
        assert seen == {**given, b"PWD": os.fsencode(str(cwd))}


# what a broken or hostile file may hold: records of any bytes, the magic, counts that lie; the only
# command it may name is a harmless one
records = st.one_of(st.binary(max_size=30), st.sampled_from([b"training-toolkit-rank-1", b"/", b"/nonexistent",
                                                               b"0", b"1", b"2", b"-1", b"99999999999999999999", b"1x",
                                                               b"true", b"/bin/true", b"", b"A=1", b"=", b"PWD=/x",
                                                               b"LD_LIBRARY_PATH=/a::/b"]))


@st.composite
def broken_files(draw) -> bytes:
    kind = draw(st.sampled_from(["random", "records", "truncated"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "records":
        parts = [b"training-toolkit-rank-1", *draw(st.lists(records, max_size=10))]
        data = b"\0".join(parts)
        return data + (b"\0" if draw(st.booleans()) else b"")
    good = rank_env.encode_rank_file("/", [draw(st.sampled_from(["true", "/bin/true", "/nonexistent"])), "a"], {"A": "1", "B": ""})
    return good[:draw(st.integers(0, len(good)))]


@settings(FUZZ, max_examples=300)
@given(data=broken_files())
def test_no_file_crashes_the_rank_program(rank_program, data):
    parts = data.split(b"\0")
    assume(len(parts) < 4 or parts[0] != b"training-toolkit-rank-1"
           or parts[3] in (b"true", b"/bin/true", b"/nonexistent", b""))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "rank.env")
        path.write_bytes(data)
        proc = run(rank_program, path)
    assert proc.returncode in (0, 127), (proc.returncode, proc.stderr)  # never a signal (negative)
    if proc.returncode == 127:
        assert proc.stderr.startswith(b"training-toolkit-rank: "), proc.stderr


def test_an_empty_or_missing_file_is_named(rank_program, tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    proc = run(rank_program, tmp_path / "empty")
    assert proc.returncode == 127 and b"not a rank file of this version" in proc.stderr
    proc = run(rank_program, tmp_path / "missing")
    assert proc.returncode == 127 and b"cannot read" in proc.stderr


# ---------------------------------------------------------------------------------------------- shim's list


@pytest.fixture(scope="module")
def shim():
    lib = ctypes.CDLL(str(native.path_of(native.NETSHIM_LIBRARY)))
    lib.training_toolkit_netshim_admits.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.training_toolkit_netshim_valid.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.training_toolkit_netshim_kept.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def kept(lib, allow: bytes) -> tuple[int, list[tuple]]:
    """What the library keeps of ``allow``, as (address, scope index) pairs."""
    out = ctypes.create_string_buffer(4096)
    count = lib.training_toolkit_netshim_kept(allow, out, len(out))
    return count, [canonical(e) for e in out.value.decode().split(",") if e]


LO = socket.if_nametoindex("lo")
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
scoped = st.tuples(st.ip_addresses(v=6, network="fe80::/10"), st.sampled_from(["lo", str(LO), "7", "4294967295"])).map(
    lambda t: f"{t[0]}%{t[1]}")
addresses = st.one_of(ipv4, ipv6, scoped)
# entries a platform or a resolver might give that are no address: names, CIDRs, spaces, bad scopes, any text
garbage = st.one_of(st.sampled_from(["algo-2", "10.0.0.0/24", " 10.0.0.2", "10.0.0.256", "fe80::1%", "fe80::1%0",
                                     "fe80::1%no-such-if0", "10.0.0.2%lo", "::1::", "", "fe80::1%" + "x" * 20]),
                    st.text(st.characters(codec="utf-8", exclude_characters=",\0"), max_size=70))


def canonical(address: str) -> tuple:
    """What an entry means to the library: the address (IPv4-mapped as IPv4), and a link-local one's scope index."""
    text, _, scope = address.partition("%")
    ip = ipaddress.ip_address(text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    index = (int(scope) if scope.isdigit() else socket.if_nametoindex(scope)) if scope else 0
    return (ip, index if ip.is_link_local else 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(addresses, min_size=1, max_size=12))
def test_valid_lists_make_a_round_trip_and_admit_each_address(shim, allowed):
    allow = ",".join(allowed).encode()
    assert shim.training_toolkit_netshim_valid(allow, None) == 0
    assert kept(shim, allow) == (len(allowed), [canonical(a) for a in allowed])
    for address in allowed:
        assert shim.training_toolkit_netshim_admits(allow, b"31000-31999", address.encode(), 31000) == 1, address


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(addresses.map(lambda a: (a, True)), garbage.map(lambda g: (g, False))), min_size=1,
                max_size=12))
def test_an_entry_that_is_no_address_never_drops_the_rest(shim, entries):
    assume(all(ok or not shim_parses(text) for text, ok in entries))  # a generated text may be an address
    allow = ",".join(text for text, _ in entries).encode("utf-8", "surrogateescape")
    good = [text for text, ok in entries if ok]
    assert shim.training_toolkit_netshim_valid(allow, None) == len(entries) - len(good)
    assert kept(shim, allow) == (len(good), [canonical(a) for a in good])
    for address in good:
        assert shim.training_toolkit_netshim_admits(allow, None, address.encode(), 31000) == 1, address
    outsider = b"203.0.113.9"
    assert shim.training_toolkit_netshim_admits(allow, None, outsider, 31000) == (
        1 if canonical("203.0.113.9") in [canonical(a) for a in good] else 0)


@settings(max_examples=500, deadline=None)
@given(st.one_of(addresses, garbage, st.binary(max_size=70).map(lambda b: b.decode("utf-8", "surrogateescape"))))
def test_python_hands_the_shim_exactly_what_it_parses(shim, text):
    assume("," not in text and "\0" not in text)
    assert shim_parses(text) == (shim.training_toolkit_netshim_valid(text.encode("utf-8", "surrogateescape"), None) == 0)


@settings(max_examples=300, deadline=None)
@given(allow=st.one_of(st.none(), st.binary(max_size=200)), ports=st.one_of(st.none(), st.binary(max_size=20)),
       peer=st.binary(max_size=70), port=st.integers(-1, 70000))
def test_no_variable_crashes_the_shim(shim, allow, ports, peer, port):
    strip = (lambda b: None if b is None else b.replace(b"\0", b""))
    assert shim.training_toolkit_netshim_admits(strip(allow), strip(ports), strip(peer), port) in (-1, 0, 1)
    assert shim.training_toolkit_netshim_valid(strip(allow), strip(ports)) >= -1
