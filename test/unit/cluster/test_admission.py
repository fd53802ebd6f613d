"""Who may take a seat: the first host's decisions, without sockets."""

from training_toolkit.cluster.admission import Addresses, Admission, RefusalLog

HOSTS = ("algo-2", "algo-3")
TABLE = {"algo-2": frozenset({"192.0.2.12"}), "algo-3": frozenset({"192.0.2.13"})}


def by_address(table=TABLE, clock=lambda: 0.0):
    return Admission(HOSTS, by_address=True, addresses=Addresses(HOSTS, lambda name: table.get(name, frozenset()), clock))


def test_without_a_secret_a_seat_is_taken_only_from_its_own_address():
    admission = by_address()
    assert admission.check_peer("192.0.2.12") is None
    assert admission.check_peer("192.0.2.99") == "not an address of this job's hosts"
    assert admission.seat("algo-2", "192.0.2.12", seated=()) is None
    assert admission.seat("algo-2", "::ffff:192.0.2.12", seated=()) is None
    assert admission.seat("algo-2", "192.0.2.13", seated=()) == "'algo-2' does not resolve to 192.0.2.13"
    assert admission.seat("algo-2", "192.0.2.12", seated=["algo-2"]) == "'algo-2' has joined already"
    assert admission.seat("algo-9", "192.0.2.12", seated=()) == "'algo-9' is not a host of this job"


def test_with_a_secret_the_address_does_not_matter():
    admission = Admission(HOSTS, by_address=False, addresses=Addresses(HOSTS, lambda name: frozenset()))
    assert admission.check_peer("203.0.113.7") is None
    assert admission.seat("algo-2", "203.0.113.7", seated=()) is None


def test_a_name_that_resolves_late_is_looked_up_again_at_most_once_a_second():
    now = [0.0]
    table: dict = {}
    calls = []

    def resolver(name):
        calls.append(name)
        return table.get(name, frozenset())

    addresses = Addresses(["algo-2"], resolver, lambda: now[0])
    assert addresses.of("algo-2") == frozenset()
    table["algo-2"] = frozenset({"192.0.2.12"})
    assert addresses.of("algo-2") == frozenset()  # not again within the second
    now[0] = 1.0
    assert addresses.of("algo-2") == frozenset({"192.0.2.12"})
    assert len(calls) == 2
    now[0] = 5.0
    table["algo-2"] = frozenset({"192.0.2.99"})
    assert addresses.of("algo-2") == frozenset({"192.0.2.12"})  # pinned once found
    assert addresses.of("algo-2", "192.0.2.12") == frozenset({"192.0.2.12"})
    assert len(calls) == 2


def test_a_name_replaced_under_a_new_address_is_looked_up_again_for_that_address_only_once_a_second():
    """A Kubernetes pod deleted and made again under its name: a new address (docs/kubernetes.md)."""
    now = [0.0]
    table = {"algo-2": frozenset({"192.0.2.12"}), "algo-3": frozenset({"192.0.2.13"})}
    admission = by_address(table, lambda: now[0])
    assert admission.seat("algo-2", "192.0.2.12", seated=()) is None  # pinned
    table["algo-2"] = frozenset({"192.0.2.22"})  # the pod replaced
    now[0] = 5.0
    assert admission.check_peer("192.0.2.22") is None
    assert admission.seat("algo-2", "192.0.2.22", seated=()) is None
    assert admission.seat("algo-2", "192.0.2.12", seated=()) == "'algo-2' does not resolve to 192.0.2.12"
    assert admission.seat("algo-3", "192.0.2.22", seated=()) == "'algo-3' does not resolve to 192.0.2.22"
    assert admission.seat("algo-2", "192.0.2.22", seated=["algo-2"]) == "'algo-2' has joined already"  # a live seat
    calls = []
    addresses = Addresses(["algo-2"], lambda name: calls.append(name) or frozenset({"192.0.2.12"}), lambda: now[0])
    assert addresses.of("algo-2") == frozenset({"192.0.2.12"})
    for _ in range(3):  # an outsider's address: one look-up a second at most
        assert not addresses.holds("203.0.113.7")
    assert len(calls) == 1
    now[0] = 6.5
    assert not addresses.holds("203.0.113.7") and len(calls) == 2


def test_handshakes_at_once_are_bounded_per_address_and_in_all():
    admission = Admission(HOSTS, by_address=False, per_address=2, total=3)
    assert admission.total == 4  # never fewer than two per host
    assert admission.enter("a") is None and admission.enter("a") is None
    assert admission.enter("a") == "more than 2 joins at once from one address"
    assert admission.enter("b") is None and admission.enter("b") is None
    assert admission.enter("c") == "more than 4 joins at once"
    admission.done("a")
    assert admission.enter("c") is None


def test_refusals_are_one_line_per_address_and_reason_then_counted():
    lines = []
    log = RefusalLog(lines.append)
    for _ in range(3):
        log.refused("192.0.2.99", "garbage")
    log.refused("192.0.2.99", "other")
    log.summary()
    assert lines == ["control channel: refused a connection from 192.0.2.99: garbage",
                     "control channel: refused a connection from 192.0.2.99: other",
                     "control channel: refused 2 more connection(s) from 192.0.2.99"]


def test_a_refusal_kind_leaves_out_what_the_peer_chose():
    lines = []
    log = RefusalLog(lines.append)
    for name in ("x1", "x2", "x3"):
        log.refused("192.0.2.12", f"{name!r} is not a host of this job", kind="<name> is not a host of this job")
    log.refused("192.0.2.13", "'x1' is not a host of this job", kind="<name> is not a host of this job")
    log.summary()
    assert lines == ["control channel: refused a connection from 192.0.2.12: 'x1' is not a host of this job",
                     "control channel: refused a connection from 192.0.2.13: 'x1' is not a host of this job",
                     "control channel: refused 2 more connection(s) from 192.0.2.12"]
