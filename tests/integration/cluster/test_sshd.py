"""A real sshd with per-job keys: logins without prompts, pinned host keys, bounded waits."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from training_toolkit.cluster.ssh import (
    MOUNTED_FILES,
    KeyMaterial,
    Sshd,
    SshdError,
    SshUnreachable,
    derive_keys,
    load_keys,
    ssh_command,
    wait_for_ssh,
    write_ssh_dir,
)

pytestmark = [pytest.mark.sshd]

SECRET = b"integration-secret-0123456789abcdef"
OTHER_SECRET = b"another-secret-0123456789abcdef!!"
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


def setup(base: Path, keys: KeyMaterial, port: int, name: str = "ssh"):
    return write_ssh_dir(base / name, keys, [HOST], port=port, listen_address=HOST, extra_known_names={HOST: [ALIAS]})


def run_ssh(layout, host: str, *command: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ssh_command(layout), host, *command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_login_works_at_once_with_no_prompt(base_dir):
    layout = setup(base_dir, derive_keys(SECRET, "itest"), free_port())
    expected_strict = "StrictModes no" if str(base_dir).startswith("/tmp") else "StrictModes yes"
    assert expected_strict in layout.sshd_config.read_text()
    with Sshd(layout):
        for host in (HOST, ALIAS):
            result = run_ssh(layout, host, "hostname")
            assert result.returncode == 0, result.stderr
            assert result.stdout.strip() == socket.gethostname()
            assert result.stderr == ""  # no prompt, no "Permanently added" warning


def test_wait_for_ssh_returns_once_every_name_answers(tmp_path):
    layout = setup(tmp_path, derive_keys(SECRET), free_port())
    with Sshd(layout):
        started = time.monotonic()
        wait_for_ssh(layout, [HOST, ALIAS], deadline_s=15)
        assert time.monotonic() - started < 10


def test_mounted_world_readable_keys_are_usable(tmp_path):
    keys = derive_keys(SECRET)
    mounted = tmp_path / "secret-volume"
    mounted.mkdir()
    for name, content in zip(MOUNTED_FILES, (keys.client_private, keys.client_public.encode(), keys.host_private, keys.host_public.encode())):
        (mounted / name).write_bytes(content)
        (mounted / name).chmod(0o644)
    layout = setup(tmp_path, load_keys(mounted), free_port())
    with Sshd(layout):
        result = run_ssh(layout, HOST, "true")
        assert result.returncode == 0, result.stderr


def test_second_sshd_on_the_same_port_fails_with_the_cause(tmp_path):
    port = free_port()
    first = setup(tmp_path, derive_keys(SECRET), port, "first")
    second = setup(tmp_path, derive_keys(SECRET), port, "second")
    with Sshd(first):
        started = time.monotonic()
        with pytest.raises(SshdError, match=rf"sshd could not listen on port {port}: .*Address already in use"):
            Sshd(second).start()
        assert time.monotonic() - started < 5
        assert run_ssh(first, HOST, "true").returncode == 0  # the first one is unharmed


def test_config_rejected_by_sshd_is_reported(tmp_path):
    layout = setup(tmp_path, derive_keys(SECRET), free_port())
    layout.sshd_config.write_text(layout.sshd_config.read_text() + "NoSuchOption yes\n")
    sshd = Sshd(layout)
    with pytest.raises(SshdError, match=r"sshd rejected .*sshd_config: .*NoSuchOption"):
        sshd.start()
    assert not sshd.running


def test_wait_for_ssh_names_a_host_where_nothing_listens(tmp_path):
    layout = setup(tmp_path, derive_keys(SECRET), free_port())
    started = time.monotonic()
    with pytest.raises(SshUnreachable) as caught:
        wait_for_ssh(layout, [HOST], deadline_s=2)
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
        layout = setup(tmp_path, derive_keys(SECRET), silent.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(SshUnreachable, match=HOST):
            wait_for_ssh(layout, [HOST, ALIAS], deadline_s=2, per_try_timeout_s=30)
        assert time.monotonic() - started < 3.5
        assert not [p for p in psutil.Process().children(recursive=True) if named(p) == "ssh" and alive(p)]
    finally:
        silent.close()


def test_a_server_with_another_host_key_is_refused(tmp_path):
    port = free_port()
    ours = derive_keys(SECRET)
    impostor_keys = KeyMaterial(
        client_private=ours.client_private,
        client_public=ours.client_public,  # it would even accept our key
        host_private=derive_keys(OTHER_SECRET).host_private,
        host_public=derive_keys(OTHER_SECRET).host_public,
    )
    client = setup(tmp_path, ours, port, "client")
    impostor = setup(tmp_path, impostor_keys, port, "impostor")
    with Sshd(impostor):
        marker = tmp_path / "ran"
        result = run_ssh(client, HOST, "touch", str(marker))
        assert result.returncode == 255
        assert "Host key verification failed" in result.stderr
        assert not marker.exists()
        with pytest.raises(SshUnreachable, match="Host key verification failed"):
            wait_for_ssh(client, [HOST], deadline_s=1)


def test_stop_ends_sshd_and_its_sessions(tmp_path):
    layout = setup(tmp_path, derive_keys(SECRET), free_port())
    sshd = Sshd(layout)
    sshd.start()
    listener = psutil.Process(sshd.pid)
    session = subprocess.Popen([*ssh_command(layout), HOST, "sleep", "300"], stdin=subprocess.DEVNULL)
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
