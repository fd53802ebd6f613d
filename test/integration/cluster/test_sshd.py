"""A real sshd with per-job keys: logins without prompts, pinned host keys, least privilege, bounded waits."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from helpers.keys import mount_keys
from training_toolkit.cluster.ssh.errors import SshdError, SshUnreachable
from training_toolkit.cluster.ssh.keys import KeyPair, generate_keypair, load_keys
from training_toolkit.cluster.ssh.layout import SshLayout, ssh_command, write_client_side, write_server_side
from training_toolkit.cluster.ssh.probe import wait_for_ssh
from training_toolkit.cluster.ssh.sshd import Sshd

pytestmark = [pytest.mark.sshd]

HOST = "127.0.0.1"
ALIAS = "localhost"


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def named(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.NoSuchProcess:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@pytest.fixture(params=["under-tmp", "under-run"])
def base_dir(request, tmp_path):
    """Both kinds of location: under sticky /tmp (StrictModes off) and under /run (StrictModes on)."""
    if request.param == "under-tmp":
        yield tmp_path
    else:
        directory = Path(tempfile.mkdtemp(prefix="tt-ssh-test-", dir="/run"))
        try:
            yield directory
        finally:
            shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Pair:
    """One host's sshd side and the first host's client side, on loopback."""

    server: SshLayout
    client: SshLayout
    client_key: KeyPair
    host_key: KeyPair


def setup(base: Path, port: int, name: str = "ssh", *, client_key: KeyPair | None = None, host_key: KeyPair | None = None,
          allowed_from=(HOST,), pinned: str | None = None) -> Pair:
    client_key = client_key or generate_keypair("client")
    host_key = host_key or generate_keypair("host")
    server = write_server_side(base / f"{name}-server", host_key=host_key,
                               authorized=[(client_key.public, list(allowed_from))], port=port, user="root", listen_addresses=[HOST])
    client = write_client_side(base / f"{name}-client", client_key=client_key, host_keys={HOST: pinned or host_key.public},
                               port=port, aliases={HOST: [ALIAS]})
    return Pair(server, client, client_key, host_key)


def run_ssh(layout, host: str, *command: str, options=(), timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ssh_command(layout), *options, host, *command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_login_works_at_once_with_no_prompt(base_dir):
    pair = setup(base_dir, free_port())
    expected_strict = "StrictModes no" if str(base_dir).startswith("/tmp") else "StrictModes yes"
    assert expected_strict in pair.server.sshd_config.read_text()
    with Sshd(pair.server):
        for host in (HOST, ALIAS):
            result = run_ssh(pair.client, host, "hostname")
            assert result.returncode == 0, result.stderr
            assert result.stdout.strip() == socket.gethostname()
            assert result.stderr == ""  # no prompt, no "Permanently added" warning


def test_the_probe_leaves_one_shared_connection_that_later_logins_use_and_end_connections_closes(tmp_path):
    from training_toolkit.supervise import procfs
    from training_toolkit.cluster.ssh.layout import end_connections

    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))  # a socket path must be short
    pair = setup(short, free_port())
    with Sshd(pair.server) as sshd:
        wait_for_ssh(pair.client, [HOST], deadline_s=15, environ=os.environ)
        mark = f"{pair.client.directory}/cm-"
        masters = [pid for pid in procfs.pids() if mark in (procfs.cmdline(pid) or "")]
        assert len(masters) == 1
        # One process per connection, forked by sshd at accept: settled once the probe has logged in
        # (its session's own processes are not, with nothing to run).
        connections = psutil.Process(sshd.pid).children
        connections_before = len(connections())
        assert run_ssh(pair.client, HOST, "true").returncode == 0  # over the shared connection
        assert len(connections()) == connections_before  # no new connection on the server
        assert end_connections(pair.client) == masters
        assert not [pid for pid in procfs.pids() if mark in (procfs.cmdline(pid) or "")]
    shutil.rmtree(short)


def test_the_probe_runs_nothing_on_the_peer_and_a_probe_without_a_shared_connection_runs_true(tmp_path):
    """No session, so no login shell (a root .bashrc can cost more than the login): shown by a forced command."""
    from training_toolkit.cluster.ssh.layout import end_connections

    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))  # room for a socket path
    long = tmp_path / ("x" * 80)  # none
    try:
        for base, probed_runs in ((short, False), (long, True)):
            pair = setup(base, free_port())
            marker = base / "ran"
            keys = pair.server.authorized_keys
            keys.write_text(keys.read_text().replace("restrict ", f'restrict,command="touch {marker}" ', 1))
            with Sshd(pair.server):
                wait_for_ssh(pair.client, [HOST], deadline_s=15, environ=os.environ)
                assert marker.exists() is probed_runs, pair.client.control_path
                assert run_ssh(pair.client, HOST, "true").returncode == 0
                assert marker.exists()  # a session does run the forced command: the check can fail
                end_connections(pair.client)
    finally:
        shutil.rmtree(short)


def test_wait_for_ssh_returns_once_every_name_answers(tmp_path):
    pair = setup(tmp_path, free_port())
    with Sshd(pair.server):
        started = time.monotonic()
        wait_for_ssh(pair.client, [HOST, ALIAS], deadline_s=15, environ=os.environ)
        assert time.monotonic() - started < 10


def test_mounted_world_readable_keys_are_usable(tmp_path):
    client, host = generate_keypair("c"), generate_keypair("h")
    keys = load_keys(mount_keys(tmp_path / "secret-volume", client, host))
    pair = setup(tmp_path, free_port(), client_key=keys.client, host_key=keys.host)
    with Sshd(pair.server):
        result = run_ssh(pair.client, HOST, "true")
        assert result.returncode == 0, result.stderr


def test_second_sshd_on_the_same_port_fails_with_the_cause(tmp_path):
    port = free_port()
    first = setup(tmp_path, port, "first")
    second = setup(tmp_path, port, "second")
    with Sshd(first.server):
        started = time.monotonic()
        with pytest.raises(SshdError, match=rf"sshd could not listen on port {port}: .*Address already in use"):
            Sshd(second.server).start()
        assert time.monotonic() - started < 5
        assert run_ssh(first.client, HOST, "true").returncode == 0  # the first one is unharmed


def test_config_rejected_by_sshd_is_reported(tmp_path):
    layout = setup(tmp_path, free_port()).server
    layout.sshd_config.write_text(layout.sshd_config.read_text() + "NoSuchOption yes\n")
    sshd = Sshd(layout)
    with pytest.raises(SshdError, match=r"sshd rejected .*sshd_config: .*NoSuchOption"):
        sshd.start()
    assert not sshd.running


def test_wait_for_ssh_names_a_host_where_nothing_listens(tmp_path):
    layout = setup(tmp_path, free_port()).client
    started = time.monotonic()
    with pytest.raises(SshUnreachable) as caught:
        wait_for_ssh(layout, [HOST], deadline_s=2, environ=os.environ)
    elapsed = time.monotonic() - started
    assert 2 <= elapsed < 3.5
    assert set(caught.value.failures) == {HOST}
    assert "Connection refused" in caught.value.failures[HOST]
    assert f"{HOST} (" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_wait_for_ssh_is_bounded_when_a_host_never_answers(tmp_path):
    """A socket that accepts connections but never speaks: ssh would wait for its banner."""
    silent = socket.socket()
    silent.bind((HOST, 0))
    silent.listen(16)
    try:
        layout = setup(tmp_path, silent.getsockname()[1]).client
        started = time.monotonic()
        with pytest.raises(SshUnreachable, match=HOST):
            wait_for_ssh(layout, [HOST, ALIAS], deadline_s=2, per_try_timeout_s=30, environ=os.environ)
        assert time.monotonic() - started < 3.5
        assert not [p for p in psutil.Process().children(recursive=True) if named(p) == "ssh" and alive(p)]
    finally:
        silent.close()


def test_a_server_with_another_host_key_is_refused(tmp_path):
    """An sshd that would even accept our key, but whose host key is not the one the job pinned."""
    pair = setup(tmp_path, free_port(), pinned=generate_keypair("expected").public)
    with Sshd(pair.server):
        marker = tmp_path / "ran"
        result = run_ssh(pair.client, HOST, "touch", str(marker))
        assert result.returncode == 255
        assert "Host key verification failed" in result.stderr
        assert not marker.exists()
        with pytest.raises(SshUnreachable, match="Host key verification failed"):
            wait_for_ssh(pair.client, [HOST], deadline_s=1, environ=os.environ)


def test_stop_ends_sshd_and_its_sessions(tmp_path):
    pair = setup(tmp_path, free_port())
    sshd = Sshd(pair.server)
    sshd.start()
    listener = psutil.Process(sshd.pid)
    session = subprocess.Popen([*ssh_command(pair.client), HOST, "sleep", "300"], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not any(named(p) == "sleep" for p in listener.children(recursive=True)):
            assert time.monotonic() < deadline, "the ssh session never started"
            time.sleep(0.05)
        ours = [listener, *listener.children(recursive=True)]
        started = time.monotonic()
        sshd.stop()
        assert time.monotonic() - started < 5
        assert session.wait(timeout=10) != 0  # the client saw its connection close
        assert [p for p in ours if alive(p)] == []
        assert not sshd.running
        sshd.stop()  # idempotent
    finally:
        session.kill()
        session.wait()
        sshd.stop()


# Least privilege: what an outsider holding nothing, or even the job's key, cannot do ---------------------


def bare_ssh(pair: Pair, key: KeyPair, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """ssh with an outsider's own options (no job config): only the key file and the pinned host key."""
    key_file = tmp_path / "outsider_key"
    key_file.write_bytes(key.private)
    key_file.chmod(0o600)
    argv = ["ssh", "-F", "/dev/null", "-i", str(key_file), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={pair.client.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-p", str(pair.server.port), *args]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)


def test_a_key_that_is_not_the_jobs_is_refused(tmp_path):
    pair = setup(tmp_path, free_port())
    with Sshd(pair.server):
        result = bare_ssh(pair, generate_keypair("outsider"), tmp_path, HOST, "true")
        assert result.returncode == 255 and "Permission denied" in result.stderr


def test_the_jobs_key_is_refused_from_an_address_outside_the_job(tmp_path):
    pair = setup(tmp_path, free_port(), allowed_from=["127.0.0.2"])  # the job's hosts; we come from 127.0.0.1
    with Sshd(pair.server):
        result = run_ssh(pair.client, HOST, "true")
        assert result.returncode == 255 and "Permission denied" in result.stderr


def test_the_jobs_key_logs_in_as_root_only(tmp_path):
    pair = setup(tmp_path, free_port())
    with Sshd(pair.server):
        result = bare_ssh(pair, pair.client_key, tmp_path, "-l", "daemon", HOST, "true")
        assert result.returncode == 255 and "Permission denied" in result.stderr


def test_no_forwarding_and_no_tty_even_with_the_jobs_key(tmp_path):
    pair = setup(tmp_path, free_port())
    with Sshd(pair.server):
        forward = bare_ssh(pair, pair.client_key, tmp_path, "-o", "ExitOnForwardFailure=yes",
                           "-R", "0:127.0.0.1:9", HOST, "sleep 2")
        assert forward.returncode == 255 and "forwarding failed" in forward.stderr, forward.stderr
        tty = bare_ssh(pair, pair.client_key, tmp_path, "-tt", HOST, "tty")
        assert "not a tty" in tty.stdout or "PTY allocation request failed" in tty.stderr, (tty.stdout, tty.stderr)
        agent = bare_ssh(pair, pair.client_key, tmp_path, "-A", HOST, "echo ${SSH_AUTH_SOCK:-none}")
        assert agent.stdout.strip() == "none"


def test_sshd_listens_on_the_jobs_address_only(tmp_path):
    pair = setup(tmp_path, free_port())
    with Sshd(pair.server):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", pair.server.port), timeout=2).close()
        socket.create_connection((HOST, pair.server.port), timeout=2).close()
