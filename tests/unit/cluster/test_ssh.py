"""Per-job SSH material: keys, exact config texts, and the files on disk."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from training_toolkit.cluster.ssh import (
    MOUNTED_FILES,
    KeyMaterial,
    KeyMaterialError,
    SshError,
    SshLayout,
    SshLayoutError,
    derive_keys,
    load_keys,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
    ssh_command,
    write_ssh_dir,
)
from training_toolkit.cluster.ssh import _strict_modes_possible

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_SECRET = b"fedcba9876543210fedcba9876543210"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def public_of(private: bytes) -> str:
    key = serialization.load_ssh_private_key(private, password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


# --------------------------------------------------------------------------- derive_keys


def test_derive_keys_is_byte_identical_for_the_same_secret():
    assert derive_keys(SECRET, "job") == derive_keys(SECRET, "job")


def test_derive_keys_differs_for_another_secret():
    a, b = derive_keys(SECRET), derive_keys(OTHER_SECRET)
    assert a.client_public.split()[1] != b.client_public.split()[1]
    assert a.host_public.split()[1] != b.host_public.split()[1]
    assert a.client_private != b.client_private


def test_client_and_host_keys_are_distinct():
    keys = derive_keys(SECRET)
    assert keys.client_public.split()[1] != keys.host_public.split()[1]


def test_label_changes_only_the_comment():
    plain, labelled = derive_keys(SECRET), derive_keys(SECRET, "job-7")
    assert plain.client_public == plain.client_public.split()[0] + " " + plain.client_public.split()[1] + " training-toolkit-client"
    assert labelled.client_public.split()[:2] == plain.client_public.split()[:2]
    assert labelled.client_public.endswith(" training-toolkit-client@job-7")
    assert labelled.host_public.endswith(" training-toolkit-host@job-7")


def test_derived_keys_parse_and_match_their_public_halves():
    keys = derive_keys(SECRET)
    assert keys.client_private.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert keys.client_private.endswith(b"-----END OPENSSH PRIVATE KEY-----\n")
    assert keys.client_public.startswith("ssh-ed25519 AAAA")
    assert public_of(keys.client_private) == " ".join(keys.client_public.split()[:2])
    assert public_of(keys.host_private) == " ".join(keys.host_public.split()[:2])


@pytest.mark.openssh
def test_ssh_keygen_reads_derived_keys(tmp_path):
    keys = derive_keys(SECRET, "job")
    for private, public in ((keys.client_private, keys.client_public), (keys.host_private, keys.host_public)):
        path = tmp_path / "key"
        path.write_bytes(private)
        path.chmod(0o600)
        out = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == public


@pytest.mark.parametrize("secret", [b"", b"short"])
def test_short_secret_is_refused(secret):
    with pytest.raises(KeyMaterialError, match="at least 16"):
        derive_keys(secret)


def test_label_with_whitespace_is_refused():
    with pytest.raises(KeyMaterialError, match="job label"):
        derive_keys(SECRET, "my job")


def test_repr_never_shows_private_keys():
    text = repr(derive_keys(SECRET))
    assert "PRIVATE" not in text and "client_private" not in text


# --------------------------------------------------------------------------- renders


def test_render_sshd_config_exact():
    text = render_sshd_config(
        host_key=Path("/run/tt/ssh/host_key"),
        authorized_keys=Path("/run/tt/ssh/authorized_keys"),
        pid_file=Path("/run/tt/ssh/sshd.pid"),
        port=2222,
        listen_address="192.0.2.10",
    )
    assert text == (
        "HostKey /run/tt/ssh/host_key\n"
        "Port 2222\n"
        "ListenAddress 192.0.2.10\n"
        "AuthorizedKeysFile /run/tt/ssh/authorized_keys\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "UsePAM no\n"
        "StrictModes yes\n"
        "PidFile /run/tt/ssh/sshd.pid\n"
        "Subsystem sftp internal-sftp\n"
        "LogLevel ERROR\n"
    )


def test_render_sshd_config_without_listen_address_and_strict_modes_off():
    text = render_sshd_config(
        host_key=Path("/d/host_key"),
        authorized_keys=Path("/d/authorized_keys"),
        pid_file=Path("/d/sshd.pid"),
        port=22,
        strict_modes=False,
    )
    assert "ListenAddress" not in text
    assert "StrictModes no\n" in text
    assert text.startswith("HostKey /d/host_key\nPort 22\nAuthorizedKeysFile /d/authorized_keys\n")


def test_render_ssh_config_exact():
    text = render_ssh_config(identity_file=Path("/run/tt/ssh/client_key"), known_hosts=Path("/run/tt/ssh/known_hosts"), port=2222)
    assert text == (
        "Host *\n"
        "    IdentityFile /run/tt/ssh/client_key\n"
        "    IdentitiesOnly yes\n"
        "    UserKnownHostsFile /run/tt/ssh/known_hosts\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    UpdateHostKeys no\n"
        "    CheckHostIP no\n"
        "    BatchMode yes\n"
        "    Port 2222\n"
        "    ConnectTimeout 5\n"
        "    ServerAliveInterval 15\n"
        "    ServerAliveCountMax 4\n"
        "    LogLevel ERROR\n"
    )


HOST_PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOV94Ja3IRlrXSpgVzOb08UjyqctqO6uOZXMaotMBkVd training-toolkit-host"


def test_render_known_hosts_exact_with_port_and_aliases():
    text = render_known_hosts(
        HOST_PUB,
        ["algo-1", "algo-2"],
        port=2222,
        extra_known_names={"algo-2": ["192.0.2.12", "algo-2.local"]},
    )
    assert text == (
        f"[algo-1]:2222 {HOST_PUB}\n"
        f"[algo-2]:2222,[192.0.2.12]:2222,[algo-2.local]:2222 {HOST_PUB}\n"
    )


def test_render_known_hosts_exact_on_port_22_with_ipv6_and_duplicates():
    text = render_known_hosts(HOST_PUB, ["algo-1", "algo-1", "::1"], port=22, extra_known_names={"algo-1": ["algo-1"]})
    assert text == f"algo-1 {HOST_PUB}\n::1 {HOST_PUB}\n"


@pytest.mark.parametrize("name", ["", "a b", "a,b", "*", "node?", "!algo", "|1|hash", "user@host", "[x]"])
def test_render_known_hosts_refuses_names_that_are_patterns(name):
    with pytest.raises(SshLayoutError, match="cannot be pinned"):
        render_known_hosts(HOST_PUB, [name], port=22)


def test_render_known_hosts_refuses_aliases_for_unknown_hosts():
    with pytest.raises(SshLayoutError, match="algo-9"):
        render_known_hosts(HOST_PUB, ["algo-1"], port=22, extra_known_names={"algo-9": ["x"]})


@pytest.mark.parametrize("port", [0, 65536, -1, True])
def test_bad_port_is_refused(port):
    with pytest.raises(SshLayoutError, match="port"):
        render_known_hosts(HOST_PUB, ["a"], port=port)


def test_errors_share_one_base():
    assert issubclass(KeyMaterialError, SshError) and issubclass(SshLayoutError, SshError)


# --------------------------------------------------------------------------- write_ssh_dir


def test_write_ssh_dir_modes_and_contents(tmp_path):
    keys = derive_keys(SECRET)
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    layout = write_ssh_dir(sticky / "ssh", keys, ["algo-1", "algo-2"], port=2222, listen_address="127.0.0.1")
    assert layout == SshLayout(directory=sticky / "ssh", port=2222)
    assert mode(layout.directory) == 0o700
    for private in (layout.client_key, layout.host_key, layout.authorized_keys, layout.sshd_config, layout.ssh_config):
        assert mode(private) == 0o600, private
    assert layout.client_key.read_bytes() == keys.client_private
    assert layout.host_key.read_bytes() == keys.host_private
    assert layout.authorized_keys.read_text() == keys.client_public + "\n"
    assert layout.known_hosts.read_text() == render_known_hosts(keys.host_public, ["algo-1", "algo-2"], port=2222)
    assert layout.ssh_config.read_text() == render_ssh_config(
        identity_file=layout.client_key, known_hosts=layout.known_hosts, port=2222
    )
    # Under a sticky world-writable parent (like /tmp) sshd's StrictModes walk would refuse the login.
    assert layout.sshd_config.read_text() == render_sshd_config(
        host_key=layout.host_key,
        authorized_keys=layout.authorized_keys,
        pid_file=layout.pid_file,
        port=2222,
        listen_address="127.0.0.1",
        strict_modes=False,
    )
    assert not [p.name for p in layout.directory.iterdir() if p.name.startswith(".")]


def test_write_ssh_dir_tightens_an_existing_directory(tmp_path):
    directory = tmp_path / "ssh"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    (directory / "client_key").write_bytes(b"old")
    (directory / "client_key").chmod(0o644)
    layout = write_ssh_dir(directory, derive_keys(SECRET), ["a"], port=22)
    assert mode(layout.directory) == 0o700
    assert mode(layout.client_key) == 0o600


def test_strict_modes_stay_on_when_no_parent_is_writable_by_others():
    assert _strict_modes_possible(Path("/usr/lib/training-toolkit-test-ssh")) is True


def test_strict_modes_go_off_under_a_sticky_world_writable_parent(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert _strict_modes_possible(sticky / "ssh") is False


def test_write_ssh_dir_refuses_a_parent_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SshLayoutError, match="writable by other users"):
        write_ssh_dir(shared / "ssh", derive_keys(SECRET), ["a"], port=22)


def test_write_ssh_dir_refuses_paths_that_configs_would_split(tmp_path):
    with pytest.raises(SshLayoutError, match="whitespace"):
        write_ssh_dir(tmp_path / "my ssh", derive_keys(SECRET), ["a"], port=22)


def test_ssh_command_uses_our_config_only(tmp_path):
    layout = SshLayout(directory=tmp_path, port=2222)
    assert ssh_command(layout) == ["ssh", "-F", str(tmp_path / "ssh_config")]


# --------------------------------------------------------------------------- load_keys


def mount(directory: Path, keys: KeyMaterial, file_mode: int = 0o644) -> Path:
    """Write keys the way a Kubernetes secret volume does: world-readable."""
    directory.mkdir()
    contents = (keys.client_private, keys.client_public + "\n", keys.host_private, keys.host_public + "\n")
    for name, content in zip(MOUNTED_FILES, contents):
        path = directory / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        path.chmod(file_mode)
    return directory


def test_load_keys_copies_world_readable_mounted_keys_to_0600(tmp_path):
    keys = derive_keys(SECRET)
    mounted = mount(tmp_path / "mounted", keys)
    loaded = load_keys(mounted)
    assert loaded == keys
    layout = write_ssh_dir(tmp_path / "ssh", loaded, ["a"], port=22)
    assert mode(layout.client_key) == 0o600 and mode(layout.host_key) == 0o600
    assert mode(mounted / "id_ed25519") == 0o644  # the mount itself is left alone


@pytest.mark.parametrize("missing", MOUNTED_FILES)
def test_load_keys_names_the_missing_file(tmp_path, missing):
    mounted = mount(tmp_path / "mounted", derive_keys(SECRET))
    (mounted / missing).unlink()
    with pytest.raises(KeyMaterialError, match=f"{mounted / missing}: missing"):
        load_keys(mounted)


def test_load_keys_refuses_a_public_key_that_does_not_match(tmp_path):
    mounted = mount(tmp_path / "mounted", derive_keys(SECRET))
    (mounted / "id_ed25519.pub").write_text(derive_keys(OTHER_SECRET).client_public + "\n")
    with pytest.raises(KeyMaterialError, match="id_ed25519.pub: does not match"):
        load_keys(mounted)


def test_load_keys_refuses_garbage(tmp_path):
    mounted = mount(tmp_path / "mounted", derive_keys(SECRET))
    (mounted / "ssh_host_ed25519_key").write_bytes(b"hello\n")
    with pytest.raises(KeyMaterialError, match="ssh_host_ed25519_key: not a PEM or OpenSSH private key"):
        load_keys(mounted)


def test_load_keys_accepts_other_key_types_and_crlf(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = rsa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    public = rsa_key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    mounted = mount(tmp_path / "mounted", derive_keys(SECRET))
    (mounted / "id_ed25519").write_bytes(private.replace(b"\n", b"\r\n"))
    (mounted / "id_ed25519.pub").write_text(public + " someone@laptop\r\n")
    loaded = load_keys(mounted)
    assert loaded.client_private == private
    assert loaded.client_public == public + " someone@laptop"
