"""Local clusters made of network namespaces: real namespaces, real processes, real sshd (needs root).

Every test that starts a cluster gets it from ``make_cluster``, which closes it and asserts
that nothing of it is left; a module-level check then asserts that no namespace or mount of
any cluster of this run survived.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from training_toolkit.supervise import procfs
from training_toolkit.core.errors import ClusterError, ConfigError
from training_toolkit.local import teardown
from training_toolkit.local.netns import Host, NamespaceCluster, leftovers

NAMES = ("algo-1", "algo-2", "algo-3")
#: Tags of this run's clusters start with it, so the final check ignores other runs' clusters.
RUN_PREFIX = f"ttt{os.getpid()}"
#: Commands inside a host get sshd's kind of PATH at best: call python by absolute path.
PYTHON = sys.executable

pytestmark = [pytest.mark.root]


# A server that answers each connection with "<its hostname> <client address> <marker>",
# which proves name resolution, the route and whose /opt/ml the server sees.
SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
for _ in range(int(sys.argv[3])):
    conn, (peer, _port) = server.accept()
    marker = open("/opt/ml/marker").read().strip()
    conn.sendall(f"{socket.gethostname()} {peer} {marker}".encode())
    conn.close()
"""
# Retries until the server listens, so no test sleeps for a guessed time.
CLIENT = """
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.02)
print(conn.makefile().read())
"""


@pytest.fixture(scope="module", autouse=True)
def nothing_left_after_the_run() -> Iterator[None]:
    yield
    held = [pid for pid in procfs.pids() if f"TT_LOCAL_CLUSTER={RUN_PREFIX}".encode() in environ(pid)]
    netns = Path("/run/netns")
    names = sorted(os.listdir(netns)) if netns.exists() else []
    mounts = [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if RUN_PREFIX in line
    ]
    assert not [n for n in names if n.startswith(RUN_PREFIX)] and mounts == [], f"leaked namespaces {names}, mounts {mounts}"
    assert held == []


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., NamespaceCluster]]:
    clusters: list[NamespaceCluster] = []

    def make(names: tuple[str, ...] = NAMES, **kwargs: object) -> NamespaceCluster:
        kwargs.setdefault("tag", f"{RUN_PREFIX}-{secrets.token_hex(3)}")
        cluster = NamespaceCluster(names, tmp_path / f"cluster{len(clusters)}", **kwargs)  # type: ignore[arg-type]
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.close()
    for cluster in clusters:
        assert cluster.leftovers() == []
        assert leftovers(cluster.tag) == []


def run_text(cluster: NamespaceCluster, host: str, argv: list[str], **kw: object) -> str:
    result = cluster.run(host, argv, timeout=20, capture_output=True, text=True, **kw)  # type: ignore[arg-type]
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def named(cluster: NamespaceCluster, host: str, names: set[str], count: int) -> list[int]:
    """The ``count`` processes in ``host`` with these names, once there are that many (they may be forking)."""
    deadline = time.monotonic() + 10
    while len(found := [p for p in cluster.pids()[host] if procfs.comm(p) in names]) != count:
        assert time.monotonic() < deadline, f"{host}: {[procfs.describe(p) for p in found]}, not {count} of {names}"
        time.sleep(0.01)
    return found


def holding(host: Host) -> list[int]:
    """The two processes that hold a host: the holder (unshare) and the init it forked."""
    init = procfs.read(host.pid)
    assert init is not None
    return sorted([init.ppid, host.pid])


def read_line(stream, timeout: float) -> str:  # type: ignore[no-untyped-def]
    """One line from a pipe, or "" at EOF or after ``timeout`` seconds."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return stream.readline()


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that does not reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- a running cluster -------------------------------------------------------------------


def test_three_hosts_start_quickly_each_with_its_own_name_and_opt_ml(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster()
    began = time.monotonic()
    cluster.start()
    elapsed = time.monotonic() - began
    print(f"\nstart of {len(NAMES)} hosts: {elapsed:.3f} s")
    assert elapsed < 1.0

    assert [h.name for h in cluster.hosts] == list(NAMES)
    assert [h.address for h in cluster.hosts] == ["192.0.2.11", "192.0.2.12", "192.0.2.13"]
    for host in cluster.hosts:
        (host.root / "opt/ml/marker").write_text(f"written for {host.name}\n")
    for host in cluster.hosts:
        assert run_text(cluster, host.name, ["hostname"]) == host.name
        assert run_text(cluster, host.name, ["cat", "/opt/ml/marker"]) == f"written for {host.name}"
        assert (
            run_text(cluster, host.name, ["cat", "/etc/hosts"])
            == cluster.hosts_file.read_text().strip()
        )
        assert run_text(cluster, host.name, ["stat", "-c", "%a %U", "/run/sshd"]) == "755 root"
        assert f"inet {host.address}/24" in run_text(
            cluster, host.name, ["ip", "-4", "-o", "addr", "show", "eth0"]
        )
        assert cluster.pids()[host.name] == holding(host)
    # nothing of it in the caller's namespaces
    assert not Path("/opt/ml/marker").exists()
    assert os.uname().nodename not in NAMES
    assert cluster.run(NAMES[0], ["true"], timeout=5).returncode == 0


def test_commands_start_in_root_unless_a_directory_inside_the_host_is_given(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(("algo-1",))
    cluster.start()
    host = cluster.hosts[0]
    (host.root / "opt/ml/input").mkdir()
    (host.root / "opt/ml/input/config.json").write_text("{}")
    assert cluster.command("algo-1", ["ls"], cwd="/opt/ml") == [
        shutil.which("nsenter"),
        f"--target={host.pid}",
        "--net",
        "--mount",
        "--uts",
        "--ipc",
        "--pid",
        "--wdns=/opt/ml",
        "--",
        "ls",
    ]
    assert run_text(cluster, "algo-1", ["pwd"]) == "/"
    assert run_text(cluster, "algo-1", ["cat", "input/config.json"], cwd="/opt/ml") == "{}"
    proc = cluster.popen(
        host,
        [PYTHON, "-c", "import os; print(os.getcwd())"],
        cwd="/opt/ml/input",
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.communicate(timeout=20)[0].strip() == "/opt/ml/input"
    with pytest.raises(ConfigError, match="no host 'algo-9'"):
        cluster.command("algo-9", ["true"])


def test_hosts_resolve_each_other_by_name_and_talk_over_tcp(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster()
    cluster.start()
    for host in cluster.hosts:
        (host.root / "opt/ml/marker").write_text(host.name)
    server = cluster.popen("algo-2", [PYTHON, "-c", SERVER, "192.0.2.12", "7000", "2"])
    answers = {
        client: run_text(cluster, client, [PYTHON, "-c", CLIENT, "algo-2", "7000"])
        for client in ("algo-1", "algo-3")
    }
    assert answers == {
        "algo-1": "algo-2 192.0.2.11 algo-2",
        "algo-3": "algo-2 192.0.2.13 algo-2",
    }
    assert server.wait(timeout=10) == 0


def test_close_kills_every_process_inside_even_daemons(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster()
    cluster.start()
    sleeper = cluster.popen("algo-1", ["sleep", "1000"])
    # Detached from our process tree: only its namespace ties it to the cluster.
    run_text(cluster, "algo-2", ["sh", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 &"])
    (daemon,) = named(cluster, "algo-2", {"sleep"}, 1)
    assert alive(daemon)
    pids = cluster.pids()
    assert sleeper.pid in pids["algo-1"] and daemon in pids["algo-2"]
    holders = [h.pid for h in cluster.hosts]

    began = time.monotonic()
    cluster.close()
    elapsed = time.monotonic() - began
    print(f"\nteardown with 2 extra processes: {elapsed:.3f} s")
    assert elapsed < 2.0

    assert sleeper.returncode == -9
    assert not alive(daemon)
    assert not any(alive(pid) for pid in holders)
    assert cluster.hosts == () and cluster.pids() == {}
    assert cluster.leftovers() == [] and leftovers(cluster.tag) == []
    cluster.close()  # idempotent
    with pytest.raises(ClusterError, match="not running"):
        cluster.popen("algo-1", ["true"])


def test_the_cluster_holds_each_namespace_open_until_its_teardown_ends(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """A freed namespace's number goes to the next one made: held, a number cannot become another cluster's while
    this one's teardown scans it for what to kill (docs/teardown.md)."""
    def held() -> set[str]:
        links = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return {link for link in links if link.startswith("net:[")}

    cluster = make_cluster()
    cluster.start()
    mine = {f"net:[{procfs.netns_of(h.pid)[1]}]" for h in cluster.hosts}
    assert len(mine) == len(NAMES) and mine <= held()
    cluster.close()
    assert not mine & held()


def test_close_after_a_failed_start_leaves_nothing(
    make_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    real_holder = NamespaceCluster._holder_argv

    def third_host_fails(self: NamespaceCluster, index: int) -> list[str]:
        if index == 2:
            return ["/bin/sh", "-c", "echo 'mount: /opt/ml: permission denied'; exit 32"]
        return real_holder(self, index)

    monkeypatch.setattr(NamespaceCluster, "_holder_argv", third_host_fails)
    cluster = make_cluster()
    with pytest.raises(
        ClusterError, match=r"host algo-3: .*exited with 32: mount: /opt/ml"
    ):
        cluster.start()
    # start() tore down the two hosts that did come up, and their namespaces
    assert cluster.hosts == ()
    assert cluster.leftovers() == [] and leftovers(cluster.tag) == []
    cluster.close()
    assert cluster.leftovers() == []


def test_a_tag_in_use_is_refused_without_harming_its_owner(make_cluster) -> None:  # type: ignore[no-untyped-def]
    owner = make_cluster(("algo-1",))
    owner.start()
    intruder = make_cluster(("algo-1",), tag=owner.tag)
    with pytest.raises(ClusterError, match="already in use"):
        intruder.start()
    intruder.close()
    assert run_text(owner, "algo-1", ["hostname"]) == "algo-1"
    assert owner.pids() == {"algo-1": holding(owner.hosts[0])}


def test_two_clusters_with_the_same_names_and_addresses_do_not_collide(make_cluster) -> None:  # type: ignore[no-untyped-def]
    first, second = make_cluster(), make_cluster()
    first.start()
    second.start()
    for cluster, marker in ((first, "first"), (second, "second")):
        (cluster.hosts[1].root / "opt/ml/marker").write_text(marker)
    # The same address and port in both: each cluster has its own network.
    servers = [
        c.popen("algo-2", [PYTHON, "-c", SERVER, "192.0.2.12", "7000", "1"])
        for c in (first, second)
    ]
    assert (
        run_text(first, "algo-1", [PYTHON, "-c", CLIENT, "algo-2", "7000"])
        == "algo-2 192.0.2.11 first"
    )
    assert (
        run_text(second, "algo-1", [PYTHON, "-c", CLIENT, "algo-2", "7000"])
        == "algo-2 192.0.2.11 second"
    )
    assert [s.wait(timeout=10) for s in servers] == [0, 0]

    survivor = second.popen("algo-3", ["sleep", "1000"])
    first.close()
    assert first.leftovers() == []
    assert survivor.poll() is None
    assert run_text(second, "algo-3", ["hostname"]) == "algo-3"
    assert survivor.pid in second.pids()["algo-3"]


@pytest.mark.sshd
def test_ssh_between_hosts_with_a_pinned_host_key(make_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster()
    cluster.start()
    server, client = cluster.hosts[0], cluster.hosts[1]

    # sshd's StrictModes refuses an AuthorizedKeysFile below a world-writable directory such
    # as /tmp, even in a 0700 directory: keep the server's files in a 0700 directory under
    # the host's /opt/ml (0755 all the way up, as sshd sees it from inside the host).
    outside = Path(tempfile.mkdtemp(prefix="sshd-", dir=server.root / "opt/ml"))
    inside = Path("/opt/ml") / outside.name
    keys = tmp_path / "client"
    keys.mkdir(mode=0o700)
    for path in (outside / "host_key", keys / "id_ed25519"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True
        )
    (outside / "authorized_keys").write_text((keys / "id_ed25519.pub").read_text())
    (outside / "authorized_keys").chmod(0o600)
    (outside / "sshd_config").write_text(
        f"ListenAddress {server.address}\n"
        f"HostKey {inside}/host_key\n"
        f"AuthorizedKeysFile {inside}/authorized_keys\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "PidFile none\n"
    )
    (server.root / "opt/ml/marker").write_text(f"/opt/ml of {server.name}\n")
    key_type, key = (outside / "host_key.pub").read_text().split()[:2]
    (keys / "known_hosts").write_text(f"{server.name},{server.address} {key_type} {key}\n")

    sshd = cluster.popen(
        server,
        ["/usr/sbin/sshd", "-D", "-e", "-f", f"{inside}/sshd_config"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(sshd.stderr, timeout=10)
        assert line.startswith(f"Server listening on {server.address} port 22"), line
        ssh = [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(keys / "id_ed25519"),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={keys / 'known_hosts'}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
        ]
        began = time.monotonic()
        remote = cluster.run(
            client,
            ssh + [f"root@{server.name}", "hostname; cat /opt/ml/marker"],
            timeout=30,
            capture_output=True,
            text=True,
        )
        elapsed = time.monotonic() - began
        print(f"\nssh round trip ({client.name} -> {server.name}): {elapsed:.3f} s")
        assert remote.returncode == 0, remote.stderr
        # the session runs in the namespaces of the sshd it landed on
        assert remote.stdout.splitlines() == [server.name, f"/opt/ml of {server.name}"]

        # A host key that is not the pinned one is refused, not accepted with a prompt.
        (keys / "known_hosts").write_text(
            f"{server.name} {key_type} {(keys / 'id_ed25519.pub').read_text().split()[1]}\n"
        )
        refused = cluster.run(
            client,
            ssh + [f"root@{server.name}", "true"],
            timeout=30,
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 255
        assert (
            "host key" in refused.stderr.lower() or "verification failed" in refused.stderr.lower()
        )

        begin_teardown = time.monotonic()
        cluster.close()
        print(f"teardown with sshd running: {time.monotonic() - begin_teardown:.3f} s")
        assert sshd.returncode == -9
    finally:
        cluster.close()
        sshd.stderr.close()


# -- a host is a PID namespace, and dies with whoever started it -------------------------


def test_a_host_is_a_pid_namespace_whose_init_reaps_orphans(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(("algo-1",))
    cluster.start()
    # its own pid space, and its own /proc: the host's init is 1, and what runs there sees itself
    assert run_text(cluster, "algo-1", ["sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; echo; echo $$"]).split(
        "\n")[0].startswith(sys.executable)
    assert run_text(cluster, "algo-1", [PYTHON, "-c", "import os; print(os.getpid() == int(os.readlink('/proc/self')))"]) \
        == "True"
    # an orphan goes to the init, which reaps it when it ends: no zombie stays
    run_text(cluster, "algo-1", ["sh", "-c", "sleep 0.2 </dev/null >/dev/null 2>&1 &"])
    deadline = time.monotonic() + 10
    while any(procfs.comm(p) == "sleep" for p in cluster.pids()["algo-1"]):
        assert time.monotonic() < deadline, "the orphan was not reaped"
        time.sleep(0.05)


def test_everything_in_a_host_dies_with_its_init(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(("algo-1", "algo-2"))
    cluster.start()
    sleeper = cluster.popen("algo-2", ["sleep", "1000"])
    run_text(cluster, "algo-2", ["sh", "-c", "setsid sh -c 'trap \"\" TERM HUP; sleep 1000' </dev/null >/dev/null 2>&1 &"])
    inside = named(cluster, "algo-2", {"sh", "sleep"}, 3)
    os.kill(cluster.hosts[1].pid, 9)  # the host's init: as when its holder dies
    assert sleeper.wait(timeout=10) == -9
    deadline = time.monotonic() + 10
    while any(alive(p) for p in inside):
        assert time.monotonic() < deadline, f"survived their host's init: {[procfs.describe(p) for p in inside]}"
        time.sleep(0.02)
    assert run_text(cluster, "algo-1", ["hostname"]) == "algo-1"  # the other host lives on


# A launcher of its own: starts a cluster, starts processes in it that ignore every polite signal,
# says where they are, and waits to be killed.
LAUNCHER = """
import json, sys, time
from pathlib import Path
from training_toolkit.local.netns import NamespaceCluster
cluster = NamespaceCluster(["algo-1", "algo-2"], Path(sys.argv[1]), tag=sys.argv[2])
cluster.start()
cluster.popen("algo-1", ["sh", "-c", "trap '' TERM HUP INT; while :; do :; done"])
cluster.run("algo-2", ["sh", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 &"], timeout=20)
print(json.dumps({"pids": cluster.pids()}), flush=True)
time.sleep(1000)
"""


@pytest.mark.whole_machine  # the root namespace's links
def test_a_launcher_killed_with_sigkill_leaves_nothing_of_its_cluster(tmp_path: Path) -> None:
    tag = f"{RUN_PREFIX}-{secrets.token_hex(3)}"
    launcher = subprocess.Popen([PYTHON, "-c", LAUNCHER, str(tmp_path / "w"), tag], stdout=subprocess.PIPE, text=True)
    try:
        line = read_line(launcher.stdout, 30)
        assert line, "the launcher did not start its cluster"
        pids = [p for host in json.loads(line)["pids"].values() for p in host]
        namespaces = {procfs.netns_of(p) for p in pids} - {None}
        assert len(pids) >= 7 and len(namespaces) == 2  # holders, inits, the spinner, the daemon, in 2 hosts
        assert len(leftovers(tag)) >= 5
        links_before = _root_links()
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
    began = time.monotonic()
    while leftovers(tag) or procfs.in_network_namespaces(namespaces) or any(alive(p) for p in pids):
        assert time.monotonic() - began < 10, f"left after the launcher died: {leftovers(tag)}"
        time.sleep(0.02)
    print(f"\nlast process of the cluster gone {time.monotonic() - began:.3f} s after the launcher")
    assert teardown.mounts_under(tmp_path / "w") == []
    assert _root_links() == links_before  # the veth pairs were never in the machine's namespace


def _root_links() -> list[str]:
    return sorted(line.split(":")[1].strip() for line in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines())


def test_the_bridge_sees_every_host_and_is_nowhere_else(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(("algo-1", "algo-2"))
    cluster.start()
    links = subprocess.run(["nsenter", f"--net={cluster.bridge_netns}", "--", "ip", "-o", "link", "show", "master", "br0"],
                           capture_output=True, text=True, timeout=20, check=True).stdout
    assert [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()] == ["veth1", "veth2"]
    assert "br0" not in " ".join(_root_links())
