"""The control channel's wire format: every frame an outsider can send is a dict or one FrameError, nothing else."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_toolkit.cluster import wire


def test_decode_round_trip():
    assert wire.decode(wire.encode({"t": "ready", "seq": 1})) == {"t": "ready", "seq": 1}


@pytest.mark.parametrize("line, reason", [
    (b'{"t": "x"}', "truncated frame"),
    (b"\xff\xfe\n", "not UTF-8"),
    (b"{nope\n", "not JSON"),
    (b"[1, 2]\n", "not a JSON object"),
    (b"[" * 100_000 + b"\n", "nested too deeply|longer than"),
    (b"[" * 50_000 + b"]" * 50_000 + b"\n", "nested too deeply|longer than"),
    (b"[" * 20_000 + b"\n", "nested too deeply|not JSON"),
    (b"x" * (wire.MAX_FRAME + 1) + b"\n", "longer than"),
])
def test_decode_refuses_with_one_reason(line, reason):
    with pytest.raises(wire.FrameError, match=reason):
        wire.decode(line)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=4096))
def test_decode_of_any_bytes_is_a_dict_or_a_frame_error(data):
    try:
        assert isinstance(wire.decode(data + b"\n"), dict)
    except wire.FrameError as exc:
        assert "\n" not in str(exc)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["t", "code", "reason", "host", "intro", "seq", "mac", "kx", "nonce", "job"]),
                       json_values, max_size=6))
def test_field_readers_accept_or_refuse_with_a_frame_error(message):
    for read in (lambda m: wire.exit_code(m), lambda m: wire.text(m, "reason", optional=True),
                 lambda m: wire.introduction(m), lambda m: wire.open_signed(b"k" * 32, 1, dict(m)),
                 lambda m: wire.KeyExchange().keys(m.get("kx"), None, "t")):
        try:
            read(message)
        except wire.FrameError:
            pass


def test_a_gos_seats_read_back_as_sent_and_what_is_not_the_jobs_is_refused():
    from training_toolkit.job.attempt import Attempt

    job = ("m", "w1", "w2", "w3")
    sent = wire.seats(Attempt(4, ("m", "w1"), ("w2",), ("w3",), ("w3", None, "w3")))
    active = wire.active(sent, job)
    spares = wire.spares(sent, job, active)
    assert (active, spares, wire.retired(sent, job, (*active, *spares)), wire.causes(sent, job)) == (
        ("m", "w1"), ("w2",), ("w3",), ("w3", None, "w3"))
    assert (wire.retired({}, job, ()), wire.causes({}, job)) == ((), ())  # a go of a version before them
    for bad in ({"retired": ["w1"]}, {"retired": ["x"]}, {"retired": "w3"}):
        with pytest.raises(wire.FrameError, match="retired"):
            wire.retired(bad, job, ("m", "w1"))  # an active host, a stranger, not a list
    for bad in ({"causes": ["x"]}, {"causes": [3]}, {"causes": "w1"}, {"causes": [None] * 17}):
        with pytest.raises(wire.FrameError, match="causes"):
            wire.causes(bad, job)
    assert [wire.cause(m, job) for m in ({}, {"cause": None}, {"cause": "w2"})] == [None, None, "w2"]
    for bad in ({"cause": "x"}, {"cause": 3}):
        with pytest.raises(wire.FrameError, match="cause"):
            wire.cause(bad, job)


def test_exit_codes_are_bytes():
    assert wire.exit_code({"code": 3}) == 3
    for bad in (-1, 256, True, "3", 3.0, None):
        with pytest.raises(wire.FrameError, match="not an exit code"):
            wire.exit_code({"code": bad})


def test_both_sides_derive_the_same_keys_and_a_secret_changes_them():
    a, b = wire.KeyExchange(), wire.KeyExchange()
    assert a.keys(b.public, None, "t") == b.keys(a.public, None, "t")
    assert a.keys(b.public, b"s" * 16, "t") == b.keys(a.public, b"s" * 16, "t")
    assert a.keys(b.public, b"s" * 16, "t") != a.keys(b.public, None, "t")
    assert a.keys(b.public, None, "t").auth != a.keys(b.public, None, "u").auth  # bound to the transcript


@pytest.mark.parametrize("kx", [None, 1, "", "!!!", "AAAA", "A" * 200, "zz" * 32, "00" * 32])
def test_bad_peer_keys_are_frame_errors(kx):
    with pytest.raises(wire.FrameError):
        wire.KeyExchange().keys(kx, None, "t")


def test_signed_messages_refuse_forgery_and_replay():
    key = b"k" * 32
    frame = json.loads(wire.sign(key, 1, "ready", {}))
    assert wire.open_signed(key, 1, dict(frame))["t"] == "ready"
    with pytest.raises(wire.FrameError, match="out of sequence"):
        wire.open_signed(key, 2, dict(frame))
    with pytest.raises(wire.FrameError, match="authentication"):
        wire.open_signed(b"x" * 32, 1, dict(frame))
    with pytest.raises(wire.FrameError, match="authentication"):
        wire.open_signed(key, 1, {**frame, "t": "failed"})


@pytest.mark.parametrize("value, expected", [
    (["a"], ("a",)),
    (["launcher.j.ns.svc", "w-0.j.ns.svc", "w-1.j.ns.svc"], ("launcher.j.ns.svc", "w-0.j.ns.svc", "w-1.j.ns.svc")),
    ([], ()),  # a first host that named none (the receiver refuses it: membership.job_hosts)
])
def test_the_welcomes_hosts(value, expected):
    assert wire.hosts({"hosts": value}) == expected


@pytest.mark.parametrize("value", [None, "a", {"a": 1}, ["a", 1], ["a", ""], ["x" * 256], ["a", "a"],
                                   ["h"] * (wire.MAX_HOSTS + 1)])
def test_the_welcomes_hosts_refused(value):
    with pytest.raises(wire.FrameError, match="field 'hosts'"):
        wire.hosts({"hosts": value})


def test_the_welcomes_hosts_are_signed():
    key, at = b"k" * 32, {"n": 0, "go": False}
    signed = wire.mac(key, *wire.welcome_signed("job", {}, at, ["a", "b", "c"]))
    assert wire.verify(key, signed, *wire.welcome_signed("job", {}, at, ("a", "b", "c")))
    for other in (["a", "b"], ["a", "c", "b"], ["a", "b", "c", "d"]):
        assert not wire.verify(key, signed, *wire.welcome_signed("job", {}, at, other))


def test_decode_takes_a_larger_limit_for_the_welcome():
    line = wire.encode({"t": "welcome", "hosts": ["h" * 200] * 400})
    assert len(line) > wire.MAX_FRAME
    with pytest.raises(wire.FrameError, match="longer than"):
        wire.decode(line)
    assert wire.decode(line, wire.MAX_WELCOME)["t"] == "welcome"


JOB = ("algo-1", "algo-2", "algo-3", "algo-4")


@pytest.mark.parametrize("value, expected", [
    (list(JOB), JOB),
    (["algo-1", "algo-4", "algo-3"], ("algo-1", "algo-4", "algo-3")),  # a spare in algo-2's seat
    (["algo-1"], ("algo-1",)),
])
def test_a_gos_active_hosts(value, expected):
    assert wire.active({"active": value}, JOB) == expected


def test_a_gos_introductions():
    intros = {"algo-2": {"ssh_client_key": "ssh-ed25519 AAAA c", "ssh_host_key": "ssh-ed25519 BBBB h"}}
    assert wire.introductions({"intros": intros}, JOB) == intros
    assert wire.introductions({}, JOB) == {}  # a go with none (a first host that has no introductions)


@pytest.mark.parametrize("value", [
    [], "x", {"algo-9": {}}, {"algo-2": "key"}, {"algo-2": {"k": 1}}, {"algo-2": {f"k{i}": "v" for i in range(9)}},
    {"algo-2": {"k": "v" * 5000}},
])
def test_a_gos_introductions_refused(value):
    """Not a map, a host not of the job, an introduction that is not a small map of short strings."""
    with pytest.raises(wire.FrameError):
        wire.introductions({"intros": value}, JOB)


@pytest.mark.parametrize("value", [
    [], ["algo-1", "algo-9"], ["algo-1", "algo-1"], "algo-1", [1], None,
])
def test_a_gos_active_hosts_refused(value):
    """None, a host not of the job, a host twice, not a list of names."""
    with pytest.raises(wire.FrameError):
        wire.active({"active": value}, JOB)


def test_a_gos_active_hosts_may_be_led_by_any_host_of_the_job():
    """After a failover the lead is not the platform's first host: the go's first host is the attempt's lead."""
    assert wire.active({"active": ["algo-2", "algo-1"]}, JOB) == ("algo-2", "algo-1")


@pytest.mark.parametrize("value", [["algo-9"], ["algo-2"], ["algo-3", "algo-3"], "algo-3", None])
def test_a_gos_spares_are_hosts_of_the_job_outside_the_active_ones(value):
    with pytest.raises(wire.FrameError):
        wire.spares({"spares": value}, JOB, ("algo-1", "algo-2"))


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12), max_size=4), st.integers(0, 10**6))
def test_a_frame_signed_with_shared_fields_is_the_frame_of_those_values(fields, seq):
    """``shared`` (encoded once for many links) changes nothing on the wire: the same bytes, the same check."""
    fields = {name: value for name, value in fields.items() if name not in ("t", "seq", "mac")}
    names = sorted(fields)
    shared = wire.shared_fields({name: fields[name] for name in names[::2]})
    rest = {name: fields[name] for name in names[1::2]}
    key = b"k" * 32
    frame = wire.sign(key, seq, "go", rest, shared)
    assert frame == wire.sign(key, seq, "go", fields)
    assert wire.open_signed(key, seq, wire.decode(frame, wire.MAX_WELCOME)) == {**fields, "t": "go", "seq": seq}
