"""Each host's ranks' environment and file (pure builders), and the two native parts run for real."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from training_toolkit import native
from training_toolkit.core.errors import ClusterError
from training_toolkit.job.mpi_options import CustomMpiOptions
from training_toolkit.runners import rank_env

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

SCRIPT_ENV = {"PATH": "/usr/bin:/bin", "SM_CURRENT_HOST": "algo-2", "SM_HP_LEARNING-RATE": "0.1"}


NO_OPTIONS = CustomMpiOptions()


def build(script_env=SCRIPT_ENV, custom=NO_OPTIONS, extra=None, preload=("/lib/tt.so",)):
    return rank_env.rank_environment(script_env, interface="eth1", custom=custom, extra=extra or {}, preload=preload)


def test_contract_nccl_defaults_and_the_preload():
    assert build() == {**SCRIPT_ENV, "NCCL_DEBUG": "INFO", "NCCL_MIN_NRINGS": "4", "NCCL_SOCKET_IFNAME": "eth1",
                       "LD_PRELOAD": "/lib/tt.so"}


def test_the_platforms_values_then_the_custom_options_win():
    env = build({**SCRIPT_ENV, "NCCL_DEBUG": "VERSION", "NCCL_SOCKET_IFNAME": "ib0", "SHARED": "mine"},
                CustomMpiOptions(("--bind-to", "core"), "WARN", (("NCCL_DEBUG", "TRACE"), ("X", "1"), ("SHARED", None))),
                {"TRAINING_TOOLKIT_RANK_TAG": "ab"})
    assert (env["NCCL_DEBUG"], env["NCCL_SOCKET_IFNAME"], env["X"], env["SHARED"]) == ("TRACE", "ib0", "1", "mine")
    assert env["TRAINING_TOOLKIT_RANK_TAG"] == "ab" and "--bind-to" not in str(env)


def test_the_users_preload_is_kept_first_and_secrets_never_reach_a_rank():
    env = build({**SCRIPT_ENV, "LD_PRELOAD": "/a.so /b.so:/lib/tt.so", "TRAINING_TOOLKIT_JOB_SECRET": "s" * 32})
    assert env["LD_PRELOAD"] == "/a.so:/b.so:/lib/tt.so"
    assert "TRAINING_TOOLKIT_JOB_SECRET" not in env
    assert "LD_PRELOAD" not in build(preload=())
    assert build(preload=("/lib/tt.so", "/lib/shim.so"))["LD_PRELOAD"] == "/lib/tt.so:/lib/shim.so"


def test_mpirun_gets_what_it_needs_and_nothing_of_the_job():
    environ = {"PATH": "/p", "HOME": "/root", "LC_ALL": "C", "OMPI_MCA_plm_rsh_args": "-o x", "PRTE_MCA_a": "1",
               "SM_HPS": "{}", "MY_SECRET": "x", "TRAINING_TOOLKIT_JOB_SECRET": "y", "OMPI_COMM_WORLD_RANK": "0"}
    assert rank_env.mpirun_environment(environ) == {"PATH": "/p", "HOME": "/root", "LC_ALL": "C",
                                                    "OMPI_MCA_plm_rsh_args": "-o x", "PRTE_MCA_a": "1"}


def test_mpirun_gets_its_preloads_and_their_variables():
    assert rank_env.mpirun_environment({"PATH": "/p", "SM_HPS": "{}", "LD_PRELOAD": "/user.so"}, ("/lib/tt.so", "/s.so"),
                                       {"SM_CURRENT_HOST": "algo-1"}) == \
        {"PATH": "/p", "LD_PRELOAD": "/lib/tt.so:/s.so", "SM_CURRENT_HOST": "algo-1"}


def test_the_file_exactly_and_what_it_refuses():
    assert rank_env.encode_rank_file("/c", ["/py", "a b"], {"B": "2", "A": "x=y\nz"}) == \
        b"training-toolkit-rank-1\0/c\x002\0/py\0a b\0A=x=y\nz\0B=2\0"
    for argv, env in ([], {}), (["a\0b"], {}), (["a"], {"A": "\0"}), (["a"], {"A=B": "1"}):
        with pytest.raises(ValueError):
            rank_env.encode_rank_file("/c", argv, env)


def test_each_host_gets_a_new_private_directory_of_its_own_even_in_a_shared_parent(tmp_path):
    """Two hosts of one job sharing the parent (nodes sharing /tmp) each make and write their own file."""
    first, second = rank_env.new_rank_file_path("0a1b", tmp_path), rank_env.new_rank_file_path("0a1b", tmp_path)
    assert first != second and first.parent.parent == second.parent.parent == tmp_path
    for path, data in ((first, b"x"), (second, b"y")):
        assert path.name == "rank.env" and path.parent.name.startswith("training-toolkit-ranks-0a1b-")
        rank_env.write_rank_file(path, data)
    assert (first.read_bytes(), second.read_bytes()) == (b"x", b"y")
    with pytest.raises(ClusterError, match="not a hex string"):
        rank_env.new_rank_file_path("../../etc", tmp_path)
    with pytest.raises(ClusterError, match="cannot make the ranks' directory"):
        rank_env.new_rank_file_path("ab", tmp_path / "missing")


def test_the_file_is_private_and_never_written_over(tmp_path):
    path = rank_env.new_rank_file_path("ab", tmp_path)
    rank_env.write_rank_file(path, b"x")
    assert (oct(path.parent.stat().st_mode & 0o777), oct(path.stat().st_mode & 0o777)) == ("0o700", "0o600")
    with pytest.raises(ClusterError, match="cannot write the ranks' file"):
        rank_env.write_rank_file(path, b"y")


def test_the_rank_program_reads_the_file_its_host_names_when_given_none(tmp_path):
    path = tmp_path / "rank.env"
    path.write_bytes(rank_env.encode_rank_file(str(tmp_path), ["sh", "-c", 'echo "$A"'], {"A": "mine", "PATH": "/usr/bin:/bin"}))
    program = str(native.path_of(native.RANK_PROGRAM))
    proc = subprocess.run([program], env={rank_env.RANK_FILE_VAR: str(path)}, capture_output=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, b"mine\n"), proc.stderr
    proc = subprocess.run([program], env={}, capture_output=True, timeout=30)
    assert proc.returncode == 64 and b"TRAINING_TOOLKIT_RANK_FILE" in proc.stderr
    proc = subprocess.run([program], env={rank_env.RANK_FILE_VAR: str(tmp_path / "gone")}, capture_output=True, timeout=30)
    assert proc.returncode == 127 and str(tmp_path / "gone").encode() in proc.stderr


def test_the_rank_program_of_an_attempt_waits_for_its_hosts_file_of_that_attempt(tmp_path):
    """mpirun may start a rank before its host's train rewrote the file for the attempt's hosts: it waits for it."""
    import threading
    import time

    path = tmp_path / "rank.env"

    def write(attempt: int | None, said: str) -> None:
        env = {"PATH": "/usr/bin:/bin", "SAID": said}
        if attempt is not None:
            env[rank_env.ATTEMPT_VAR] = str(attempt)
        data = rank_env.encode_rank_file(str(tmp_path), ["sh", "-c", 'echo "$SAID ${TRAINING_TOOLKIT_RANK_ATTEMPT-}"'],
                                         env)
        rank_env.rewrite_rank_file(path, data) if path.exists() else path.write_bytes(data)

    program = str(native.path_of(native.RANK_PROGRAM))
    write(None, "before any attempt")
    started = time.monotonic()  # before the timer: the file of attempt 2 is written 0.5 s after this at the earliest
    later = threading.Timer(0.5, write, (2, "attempt two's"))
    later.start()
    proc = subprocess.run([program, rank_env.ATTEMPT_FLAG, "2"], env={rank_env.RANK_FILE_VAR: str(path)},
                          capture_output=True, timeout=30)
    later.join()
    assert (proc.returncode, proc.stdout) == (0, b"attempt two's \n"), proc.stderr  # the file's entry, not the rank's
    assert time.monotonic() - started >= 0.5  # it waited: the file before was of no attempt
    write(1, "attempt one's")  # an earlier attempt's file is never taken for a later one (nor a later for an earlier)
    proc = subprocess.run([program, rank_env.ATTEMPT_FLAG, "1", str(path)], env={}, capture_output=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, b"attempt one's \n"), proc.stderr
    for bad in ("", "x", "-1", "1a"):
        proc = subprocess.run([program, rank_env.ATTEMPT_FLAG, bad, str(path)], env={}, capture_output=True, timeout=30)
        assert proc.returncode == 64 and b"--attempt takes a number" in proc.stderr, (bad, proc.stderr)
    proc = subprocess.run([program, rank_env.ATTEMPT_FLAG, "1", str(tmp_path / "gone")], env={}, capture_output=True,
                          timeout=30)
    assert proc.returncode == 127 and b"cannot read" in proc.stderr  # no wait for a file that is not there


def run_rank(tmp_path, argv, env, inherited, cwd=None):
    path = tmp_path / "rank.env"
    path.write_bytes(rank_env.encode_rank_file(str(cwd or tmp_path), argv, env))
    program = str(native.path_of(native.RANK_PROGRAM))
    return subprocess.run([program, str(path)], env=inherited, capture_output=True, timeout=30)


def test_the_rank_program_runs_the_files_command_with_its_environment_and_the_runtimes(tmp_path):
    dump = "import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), dict(os.environ), os.getpid()]))"
    env = {"PATH": "/usr/bin:/bin", "PWD": "/elsewhere", "SM_HP_LEARNING-RATE": "0.1", "MULTI": "a\nb", "OMPI_COMM_WORLD_RANK": "file's",
           "LD_LIBRARY_PATH": "/file/lib:/shared"}
    inherited = {"OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3", "PRTE_LAUNCHED": "1", "OPAL_PREFIX": "/o",
                 "HFI_NO_BACKTRACE": "1", "LD_LIBRARY_PATH": "/ompi/lib:/shared", "SSH_CONNECTION": "x",
                 "HOME": "/sshd", "TRAINING_TOOLKIT_SUPERVISOR": "t"}
    proc = run_rank(tmp_path, [sys.executable, "-c", dump, "a b", ""], env, inherited, cwd="/")
    assert proc.returncode == 0, proc.stderr
    import json

    argv, cwd, seen, pid = json.loads(proc.stdout)
    assert argv == ["a b", ""] and cwd == "/"
    seen.pop("LC_CTYPE", None)  # Python's own locale coercion
    assert seen.pop("TRAINING_TOOLKIT_RANK_PID") == str(pid)  # the rank is the process it starts (native/rank_stop.c)
    assert seen.pop("TRAINING_TOOLKIT_RANK_PARENT") != str(pid)  # and stays its parent
    assert seen == {"PATH": "/usr/bin:/bin", "SM_HP_LEARNING-RATE": "0.1", "MULTI": "a\nb", "OMPI_COMM_WORLD_RANK": "3",
                    "PMIX_RANK": "3", "PRTE_LAUNCHED": "1", "OPAL_PREFIX": "/o", "HFI_NO_BACKTRACE": "1",
                    "TRAINING_TOOLKIT_SUPERVISOR": "t", "LD_LIBRARY_PATH": "/ompi/lib:/shared:/file/lib", "PWD": "/"}


def test_the_rank_program_finds_the_command_on_the_files_path_and_names_what_fails(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tool").write_text("#!/bin/sh\necho found \"$@\"\n")
    (bin_dir / "tool").chmod(0o755)
    assert run_rank(tmp_path, ["tool", "x"], {"PATH": str(bin_dir)}, {}).stdout == b"found x\n"
    proc = run_rank(tmp_path, ["no-such-tool"], {"PATH": str(bin_dir)}, {})
    assert proc.returncode == 127 and b"training-toolkit-rank: cannot run no-such-tool: No such file" in proc.stderr
    proc = run_rank(tmp_path, ["tool"], {}, {}, cwd=tmp_path / "gone")
    assert proc.returncode == 127 and b"cannot enter the code directory" in proc.stderr
    (tmp_path / "bad.env").write_bytes(b"other\0/\x001\0true\0")
    proc = subprocess.run([str(native.path_of(native.RANK_PROGRAM)), str(tmp_path / "bad.env")], capture_output=True,
                          timeout=30)
    assert proc.returncode == 127 and b"not a rank file of this version" in proc.stderr


@pytest.mark.parametrize("command", [["hostname"], [sys.executable, "-c", "import socket; print(socket.gethostname())"]])
def test_the_preload_answers_gethostname_with_the_hosts_name_in_any_language(command):
    preload = str(native.path_of(native.HOSTNAME_LIBRARY))
    kernel = os.uname().nodename
    base = {"PATH": os.environ["PATH"], "LD_PRELOAD": preload}
    assert subprocess.run(command, env={**base, "SM_CURRENT_HOST": "algo-7"}, capture_output=True, text=True,
                          timeout=30).stdout.strip() == "algo-7"
    assert subprocess.run(command, env=base, capture_output=True, text=True, timeout=30).stdout.strip() == kernel
    long_name = "h" * 300
    out = subprocess.run([sys.executable, "-c", "import socket; print(socket.gethostname())"],
                         env={**base, "SM_CURRENT_HOST": long_name}, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == long_name  # Python asks with a 1024-byte buffer


def test_missing_native_parts_are_named(tmp_path):
    with pytest.raises(native.NativeMissing, match="built when it is installed, with a C compiler"):
        native.path_of(native.RANK_PROGRAM, tmp_path)


def test_gethostname_is_told_the_host_only_where_the_kernel_does_not_say_it_already():
    assert rank_env.needs_hostname_preload("aws", "algo-2")  # SageMaker: every container is "aws"
    assert not rank_env.needs_hostname_preload("algo-2", "algo-2")  # a local host, a Slurm node
    assert not rank_env.needs_hostname_preload("js-workers-0-1", "js-workers-0-1.js")  # a JobSet pod by its FQDN
    assert rank_env.needs_hostname_preload("js-workers-0-1", "js-workers-0-2.js")


def test_through_slurm_each_host_names_its_ranks_directory_after_its_node(tmp_path):
    """Every daemon gets mpirun's one environment: the path is the same but for the node's name (%n)."""
    import pytest

    from training_toolkit.core.errors import ClusterError
    from training_toolkit.runners import rank_env
    from training_toolkit.runners.mpi_launch import slurm_paths

    one = rank_env.node_rank_file_path("ab12", "node1", tmp_path)
    two = rank_env.node_rank_file_path("ab12", "node2", tmp_path)  # a parent the nodes share: apart by name
    assert one == tmp_path / "training-toolkit-ranks-ab12-node1" / "rank.env" and one.parent.stat().st_mode & 0o777 == 0o700
    assert two.parent.name == "training-toolkit-ranks-ab12-node2"
    with pytest.raises(ClusterError, match="cannot make the ranks' directory"):  # one it did not make: refused
        rank_env.node_rank_file_path("ab12", "node1", tmp_path)
    with pytest.raises(ClusterError, match="cannot name a directory"):
        rank_env.node_rank_file_path("ab12", "../x", tmp_path)
    paths = slurm_paths(one, "node1")
    assert paths == {"TRAINING_TOOLKIT_RANK_FILE": str(tmp_path / "training-toolkit-ranks-ab12-%n" / "rank.env"),
                     "SLURMD_NODENAME": "node1"}


def test_the_rank_program_completes_a_slurm_path_with_its_nodes_name(tmp_path):
    """native/rank_exec.c: ``%n`` in TRAINING_TOOLKIT_RANK_FILE is the node's SLURMD_NODENAME; without one, refused."""
    import subprocess

    from training_toolkit import native
    from training_toolkit.runners import rank_env

    path = rank_env.node_rank_file_path("cd34", "node2", tmp_path)
    rank_env.write_rank_file(path, rank_env.encode_rank_file(str(tmp_path), ["/bin/sh", "-c", "echo ran in $PWD"], {}))
    program = str(native.path_of(native.RANK_PROGRAM))
    template = str(tmp_path / "training-toolkit-ranks-cd34-%n" / "rank.env")
    ran = subprocess.run([program], env={"TRAINING_TOOLKIT_RANK_FILE": template, "SLURMD_NODENAME": "node2"},
                         capture_output=True, text=True, timeout=30)
    assert (ran.returncode, ran.stdout) == (0, f"ran in {tmp_path}\n"), ran.stderr
    bare = subprocess.run([program], env={"TRAINING_TOOLKIT_RANK_FILE": template}, capture_output=True, text=True,
                          timeout=30)
    assert bare.returncode != 0 and "usage" in bare.stderr  # a %n path and no node name: nothing is guessed
