"""Per-job SSH material: random keys, exact config texts, and the files on disk."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from helpers.keys import mount_keys
from training_toolkit.cluster.ssh.config import (
    render_authorized,
    render_authorized_keys,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
)
from training_toolkit.cluster.ssh.errors import KeyMaterialError, SshError, SshLayoutError
from training_toolkit.cluster.ssh.keys import MOUNTED_FILES, generate_keypair, load_keys
from training_toolkit.cluster.ssh.layout import (
    SshLayout,
    admit,
    new_ssh_dir,
    ssh_command,
    strict_modes_possible,
    write_client_side,
    write_server_side,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def public_of(private: bytes) -> str:
    key = serialization.load_ssh_private_key(private, password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


# --------------------------------------------------------------------------- keys


def test_generated_keys_are_new_every_time_and_match_their_public_halves():
    a, b = generate_keypair("c"), generate_keypair("c")
    assert a.public.split()[1] != b.public.split()[1] and a.private != b.private
    assert a.private.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert public_of(a.private) == " ".join(a.public.split()[:2])
    assert a.public.startswith("ssh-ed25519 AAAA") and a.public.endswith(" c")


@pytest.mark.process
@pytest.mark.openssh
def test_ssh_keygen_reads_generated_keys(tmp_path):
    pair = generate_keypair("job")
    path = tmp_path / "key"
    path.write_bytes(pair.private)
    path.chmod(0o600)
    out = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == " ".join(pair.public.split()[:2])


def test_repr_never_shows_private_keys():
    assert "PRIVATE" not in repr(generate_keypair("c"))


# --------------------------------------------------------------------------- renders


def test_render_sshd_config_exact():
    text = render_sshd_config(
        host_key=Path("/run/tt/host_key"),
        authorized_keys=Path("/run/tt/authorized_keys"),
        pid_file=Path("/run/tt/sshd.pid"),
        port=2222,
        user="root",
        listen_addresses=["192.0.2.10", "2001:db8::a"],
    )
    assert text == (
        "HostKey /run/tt/host_key\n"
        "Port 2222\n"
        "ListenAddress 192.0.2.10\n"
        "ListenAddress [2001:db8::a]\n"
        "AuthorizedKeysFile /run/tt/authorized_keys\n"
        "AuthenticationMethods publickey\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "AllowUsers root\n"
        "UsePAM no\n"
        "StrictModes yes\n"
        "PidFile /run/tt/sshd.pid\n"
        "DisableForwarding yes\n"
        "AllowAgentForwarding no\n"
        "AllowTcpForwarding no\n"
        "AllowStreamLocalForwarding no\n"
        "X11Forwarding no\n"
        "PermitTunnel no\n"
        "PermitTTY no\n"
        "PermitUserRC no\n"
        "PermitUserEnvironment no\n"
        "MaxAuthTries 2\n"
        "LoginGraceTime 10\n"
        "PerSourceMaxStartups 4\n"
        "MaxStartups 64:30:128\n"
        "LogLevel ERROR\n"
        "SetEnv SHLVL=1 ZDOTDIR=/run/tt\n"
    )


def test_render_sshd_config_for_another_user_without_listen_address_and_strict_modes_off():
    text = render_sshd_config(host_key=Path("/d/host_key"), authorized_keys=Path("/d/authorized_keys"),
                              pid_file=Path("/d/sshd.pid"), port=22, user="trainer", strict_modes=False)
    assert "ListenAddress" not in text
    assert "StrictModes no\n" in text and "PermitRootLogin no\n" in text and "AllowUsers trainer\n" in text


def test_render_sshd_config_refuses_a_listen_address_that_is_not_one():
    with pytest.raises(SshLayoutError, match="not an IP address"):
        render_sshd_config(host_key=Path("/d/k"), authorized_keys=Path("/d/a"), pid_file=Path("/d/p"), port=22,
                           user="root", listen_addresses=["algo-1"])


def test_render_authorized_keys_exact():
    assert render_authorized_keys("ssh-ed25519 AAAAkey  c@algo-1 ", ["192.0.2.11", "192.0.2.12", "192.0.2.11"]) == (
        'from="192.0.2.11,192.0.2.12",restrict ssh-ed25519 AAAAkey c@algo-1\n'
    )
    with pytest.raises(SshLayoutError, match="no address"):
        render_authorized_keys("ssh-ed25519 AAAAkey", [])
    with pytest.raises(SshLayoutError, match="not an IP address"):
        render_authorized_keys("ssh-ed25519 AAAAkey", ['1.2.3.4" command="sh'])


def test_render_authorized_exact():
    """Each host's client key from its own addresses only; none at all admits nobody (an empty file)."""
    assert render_authorized([("ssh-ed25519 AAAAone c@algo-1", ["192.0.2.11"]),
                              ("ssh-ed25519 AAAAtwo c@algo-2", ["192.0.2.12", "2001:db8::12"])]) == (
        'from="192.0.2.11",restrict ssh-ed25519 AAAAone c@algo-1\n'
        'from="192.0.2.12,2001:db8::12",restrict ssh-ed25519 AAAAtwo c@algo-2\n'
    )
    assert render_authorized([]) == ""
    # one key of several hosts (mounted keys): one line from all their addresses
    assert render_authorized([("ssh-ed25519 AAAAone c@a", ["192.0.2.11"]), ("ssh-ed25519 AAAAtwo", ["192.0.2.12"]),
                              ("ssh-ed25519 AAAAone other", ["192.0.2.13"])]) == (
        'from="192.0.2.11,192.0.2.13",restrict ssh-ed25519 AAAAone c@a\n'
        'from="192.0.2.12",restrict ssh-ed25519 AAAAtwo\n'
    )
    with pytest.raises(SshLayoutError, match="no address"):
        render_authorized([("ssh-ed25519 AAAAone", ["192.0.2.11"]), ("ssh-ed25519 AAAAtwo", [])])


def test_admit_replaces_the_keys_whole(tmp_path):
    host, one, two = generate_keypair("h"), generate_keypair("1"), generate_keypair("2")
    layout = write_server_side(sticky_parent(tmp_path) / "ssh", host_key=host, authorized=[], port=2222, user="root")
    assert layout.authorized_keys.read_text() == ""
    admit(layout, [(one.public, ["192.0.2.11"]), (two.public, ["192.0.2.12"])])
    assert layout.authorized_keys.read_text() == render_authorized([(one.public, ["192.0.2.11"]),
                                                                    (two.public, ["192.0.2.12"])])
    assert mode(layout.authorized_keys) == 0o600
    admit(layout, [])
    assert layout.authorized_keys.read_text() == ""


def test_render_ssh_config_exact():
    text = render_ssh_config(identity_file=Path("/run/tt/client_key"), known_hosts=Path("/run/tt/known_hosts"), port=2222)
    assert text == (
        "Host *\n"
        "    IdentityFile /run/tt/client_key\n"
        "    IdentitiesOnly yes\n"
        "    UserKnownHostsFile /run/tt/known_hosts\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    UpdateHostKeys no\n"
        "    CheckHostIP no\n"
        "    BatchMode yes\n"
        "    ForwardAgent no\n"
        "    ForwardX11 no\n"
        "    ClearAllForwardings yes\n"
        "    Port 2222\n"
        "    ConnectTimeout 5\n"
        "    ServerAliveInterval 15\n"
        "    ServerAliveCountMax 4\n"
        "    LogLevel ERROR\n"
    )


KEY_2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOV94Ja3IRlrXSpgVzOb08UjyqctqO6uOZXMaotMBkVd"
KEY_3 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHhBcUo0l2ZpZjR4k8Vp1kS3X5m2C9F2w2Q8uKxk2l8a"


def test_render_ssh_config_shares_one_connection_per_host():
    text = render_ssh_config(identity_file=Path("/d/k"), known_hosts=Path("/d/h"), port=22, control_path="/d/cm-%C")
    assert text.endswith("    ControlMaster auto\n    ControlPath /d/cm-%C\n    ControlPersist 60\n")


def test_render_known_hosts_pins_each_host_its_own_key_with_port_and_aliases():
    text = render_known_hosts({"algo-2": KEY_2 + " host@algo-2", "algo-3": KEY_3}, port=2222,
                              aliases={"algo-3": ["192.0.2.13", "algo-3.local"]})
    assert text == f"[algo-2]:2222 {KEY_2}\n[algo-3]:2222,[192.0.2.13]:2222,[algo-3.local]:2222 {KEY_3}\n"


def test_render_known_hosts_on_port_22():
    assert render_known_hosts({"algo-2": KEY_2, "::1": KEY_3}, port=22) == f"algo-2 {KEY_2}\n::1 {KEY_3}\n"


@pytest.mark.parametrize("name", ["", "a b", "a,b", "*", "node?", "!algo", "|1|hash", "user@host", "[x]"])
def test_render_known_hosts_refuses_names_that_are_patterns(name):
    with pytest.raises(SshLayoutError, match="cannot be pinned"):
        render_known_hosts({name: KEY_2}, port=22)


def test_render_known_hosts_refuses_aliases_for_unknown_hosts():
    with pytest.raises(SshLayoutError, match="algo-9"):
        render_known_hosts({"algo-1": KEY_2}, port=22, aliases={"algo-9": ["x"]})


@pytest.mark.parametrize("port", [0, 65536, -1, True])
def test_bad_port_is_refused(port):
    with pytest.raises(SshLayoutError, match="port"):
        render_known_hosts({"a": KEY_2}, port=port)


def test_errors_share_one_base():
    assert issubclass(KeyMaterialError, SshError) and issubclass(SshLayoutError, SshError)


# --------------------------------------------------------------------------- the directory


def sticky_parent(tmp_path: Path) -> Path:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    return sticky


def test_server_side_modes_and_contents(tmp_path):
    host, client = generate_keypair("h"), generate_keypair("c")
    layout = write_server_side(sticky_parent(tmp_path) / "ssh", host_key=host, authorized=[(client.public, ["192.0.2.11"])],
                               port=2222, user="root", listen_addresses=["192.0.2.12"])
    assert mode(layout.directory) == 0o700
    assert sorted(p.name for p in layout.directory.iterdir()) == ["authorized_keys", "host_key", "sshd_config"]
    for path in layout.directory.iterdir():
        assert mode(path) == 0o600, path
    assert layout.host_key.read_bytes() == host.private
    assert layout.authorized_keys.read_text() == render_authorized_keys(client.public, ["192.0.2.11"])
    # Under a sticky world-writable parent (like /tmp) sshd's StrictModes walk would refuse the login.
    assert layout.sshd_config.read_text() == render_sshd_config(
        host_key=layout.host_key, authorized_keys=layout.authorized_keys, pid_file=layout.pid_file, port=2222,
        user="root", listen_addresses=["192.0.2.12"], strict_modes=False)


def test_an_attempts_hosts_replace_the_addresses_the_client_key_is_admitted_from(tmp_path):
    host, client = generate_keypair("h"), generate_keypair("c")
    layout = write_server_side(sticky_parent(tmp_path) / "ssh", host_key=host, port=2222, user="root",
                               authorized=[(client.public, ["192.0.2.11", "192.0.2.12", "192.0.2.13"])])
    admit(layout, [(client.public, ["192.0.2.11", "192.0.2.13"])])
    assert layout.authorized_keys.read_text() == render_authorized_keys(client.public, ["192.0.2.11", "192.0.2.13"])
    assert layout.authorized_keys.read_text().startswith('from="192.0.2.11,192.0.2.13",restrict ')
    assert mode(layout.authorized_keys) == 0o600
    assert sorted(p.name for p in layout.directory.iterdir()) == ["authorized_keys", "host_key", "sshd_config"]
    with pytest.raises(SshLayoutError, match="no address"):
        admit(layout, [(client.public, [])])  # a key without addresses would be admitted from anywhere: refused
    assert layout.authorized_keys.read_text() == render_authorized_keys(client.public, ["192.0.2.11", "192.0.2.13"])


def test_client_side_modes_and_contents():
    client = generate_keypair("c")
    directory = new_ssh_dir(Path("/tmp"))
    try:
        layout = write_client_side(directory, client_key=client, host_keys={"algo-2": KEY_2}, port=22)
        assert sorted(p.name for p in layout.directory.iterdir()) == ["client_key", "known_hosts", "ssh_config"]
        for path in layout.directory.iterdir():
            assert mode(path) == 0o600, path
        assert layout.client_key.read_bytes() == client.private
        assert layout.known_hosts.read_text() == f"algo-2 {KEY_2}\n"
        assert layout.ssh_config.read_text() == render_ssh_config(identity_file=layout.client_key,
                                                                  known_hosts=layout.known_hosts, port=22,
                                                                  control_path=str(directory / "cm-%C"))
    finally:
        shutil.rmtree(directory)


def test_no_shared_connection_where_its_socket_path_would_not_fit(tmp_path):
    deep = tmp_path / ("d" * 60)
    layout = write_client_side(deep, client_key=generate_keypair("c"), host_keys={"algo-2": KEY_2}, port=22)
    assert "ControlPath" not in layout.ssh_config.read_text()


def test_a_workers_client_side_shares_no_connection():
    """A daemon's logins (tree spawn) leave no ControlMaster behind: the session ends with the job's daemon."""
    directory = new_ssh_dir(Path("/tmp"))
    try:
        layout = write_client_side(directory, client_key=generate_keypair("c"), host_keys={"algo-2": KEY_2}, port=22,
                                   shared_connections=False)
        assert layout.ssh_config.read_text() == render_ssh_config(identity_file=layout.client_key,
                                                                  known_hosts=layout.known_hosts, port=22)
    finally:
        shutil.rmtree(directory)


def test_new_ssh_dirs_are_private_and_new_each_time(tmp_path):
    a, b = new_ssh_dir(tmp_path), new_ssh_dir(tmp_path)
    assert a != b and mode(a) == 0o700 and a.name.startswith("training-toolkit-ssh-")


def test_strict_modes_stay_on_when_no_parent_is_writable_by_others():
    assert strict_modes_possible(Path("/usr/lib/training-toolkit-test-ssh")) is True


def test_write_refuses_a_parent_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SshLayoutError, match="writable by other users"):
        write_client_side(shared / "ssh", client_key=generate_keypair("c"), host_keys={"a": KEY_2}, port=22)


def test_write_refuses_paths_that_configs_would_split(tmp_path):
    with pytest.raises(SshLayoutError, match="whitespace"):
        write_client_side(tmp_path / "my ssh", client_key=generate_keypair("c"), host_keys={"a": KEY_2}, port=22)


def test_ssh_command_uses_our_config_only(tmp_path):
    assert ssh_command(SshLayout(directory=tmp_path, port=2222)) == ["ssh", "-F", str(tmp_path / "ssh_config")]


# --------------------------------------------------------------------------- mounted keys


def test_load_keys_reads_world_readable_mounted_keys(tmp_path):
    client, host = generate_keypair("c"), generate_keypair("h")
    loaded = load_keys(mount_keys(tmp_path / "mounted", client, host))
    assert (loaded.client, loaded.host) == (client, host)


@pytest.mark.parametrize("missing", MOUNTED_FILES)
def test_load_keys_names_the_missing_file(tmp_path, missing):
    mounted = mount_keys(tmp_path / "mounted", generate_keypair("c"), generate_keypair("h"))
    (mounted / missing).unlink()
    with pytest.raises(KeyMaterialError, match=f"{mounted / missing}: missing"):
        load_keys(mounted)


def test_load_keys_refuses_a_public_key_that_does_not_match(tmp_path):
    mounted = mount_keys(tmp_path / "mounted", generate_keypair("c"), generate_keypair("h"))
    (mounted / "id_ed25519.pub").write_text(generate_keypair("x").public + "\n")
    with pytest.raises(KeyMaterialError, match="id_ed25519.pub: does not match"):
        load_keys(mounted)


def test_load_keys_refuses_garbage(tmp_path):
    mounted = mount_keys(tmp_path / "mounted", generate_keypair("c"), generate_keypair("h"))
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
    mounted = mount_keys(tmp_path / "mounted", generate_keypair("c"), generate_keypair("h"))
    (mounted / "id_ed25519").write_bytes(private.replace(b"\n", b"\r\n"))
    (mounted / "id_ed25519.pub").write_text(public + " someone@laptop\r\n")
    assert load_keys(mounted).client.private == private


def test_the_probe_opens_the_shared_connection_with_no_command_and_runs_true_where_there_can_be_none():
    from training_toolkit.cluster.ssh.probe import probe_target

    short = SshLayout(Path("/run/training-toolkit-ssh-abc"), 22)
    assert short.control_path == "/run/training-toolkit-ssh-abc/cm-%C"
    assert probe_target(short, "algo-2") == ["-S", "/run/training-toolkit-ssh-abc/cm-%C", "-N", "algo-2"]
    long = SshLayout(Path("/tmp/" + "d" * 50), 22)  # 56 + 4 + 40 + 17 bytes: no room for the socket
    assert long.control_path is None
    assert probe_target(long, "algo-2") == ["algo-2", "true"]
