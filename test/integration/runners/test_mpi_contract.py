"""What every MPI rank sees, on hosts whose kernel host name is ``aws`` (as on SageMaker).

Real hosts (namespaces), real sshd and mpirun: each rank reports its environment, its
``gethostname()`` as Python, a C program (``hostname``) and MPI (``MPI_Get_processor_name``)
see it, and ``uname()``'s node name, which the preload library leaves alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import kubernetes as k8s
from helpers.multihost import hps, rank_files, run
from helpers.paths import OMPI5_BIN, TOOLKIT_PYTHON
from training_toolkit import native
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

H2 = ("algo-1", "algo-2")
FAST = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30"}
USER_PRELOAD = "/usr/lib/x86_64-linux-gnu/libutil.so.1"  # any harmless library: the user's own preload

RANK_SCRIPT = """\
import json, os, socket, subprocess, sys
from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
names = ("SM_CURRENT_HOST", "NCCL_DEBUG", "NCCL_MIN_NRINGS", "NCCL_SOCKET_IFNAME", "MY_VAR", "FROM_HOST", "LD_PRELOAD",
         "TRAINING_TOOLKIT_NETSHIM_PORTS", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SSH_CONNECTION")
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "python": socket.gethostname(), "mpi": MPI.Get_processor_name(),
               "c": subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip(),
               "uname": os.uname().nodename, "local_rank": int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]),
               "env": {n: os.environ.get(n) for n in names}, "cwd": os.getcwd(), "argv": sys.argv[1:]}, f)
"""


def kernel_name_aws(cluster) -> None:
    """Every host's kernel host name is "aws"; its DNS name and /opt/ml stay its own (SageMaker's containers)."""
    for host in cluster.hosts:
        cluster.run(host, ["/bin/sh", "-c", "printf aws > /proc/sys/kernel/hostname"], timeout=10, check=True)


def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "ranks.py").write_text(RANK_SCRIPT)
    return src


def job(tmp_path: Path, custom: str, env: dict | None = None, **extra) -> LocalJob:
    return LocalJob(hosts=H2, env={**FAST, **(env or {})},
                    hyperparameters=hps("ranks.py", source(tmp_path), sagemaker_mpi_enabled=True,
                                        sagemaker_mpi_num_of_processes_per_host=2,
                                        sagemaker_mpi_custom_mpi_options=custom, **extra))


def test_custom_options_host_names_and_nccl_defaults_on_hosts_named_aws(tmp_path):
    custom = "--NCCL_DEBUG=WARN -x MY_VAR=on -x FROM_HOST --mca btl_tcp_eager_limit 65536"
    env = {"FROM_HOST": "each host's own", "LD_PRELOAD": USER_PRELOAD}
    results = run(job(tmp_path, custom, env, msg="a b"), tmp_path, before_start=kernel_name_aws)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    preload = (f"{native.path_of(native.HOSTNAME_LIBRARY)}:{native.path_of(native.NETSHIM_LIBRARY)}:"
               f"{native.path_of(native.RANK_STOP_LIBRARY)}")
    for rank, info in ranks.items():
        host = H2[rank // 2]
        assert (info["host"], info["python"], info["mpi"], info["c"]) == (host, host, host, host), info
        assert info["uname"] == "aws", "uname() is the kernel's, as in the reference"
        assert info["local_rank"] == rank % 2
        assert info["env"] == {
            "SM_CURRENT_HOST": host, "NCCL_DEBUG": "WARN", "NCCL_MIN_NRINGS": "4", "NCCL_SOCKET_IFNAME": "eth0",
            "MY_VAR": "on", "FROM_HOST": "each host's own", "LD_PRELOAD": f"{USER_PRELOAD}:{preload}",
            "TRAINING_TOOLKIT_NETSHIM_PORTS": "31000-31999", "RANK": None, "LOCAL_RANK": None, "WORLD_SIZE": None, "LOCAL_WORLD_SIZE": None,
            "MASTER_ADDR": None, "MASTER_PORT": None, "SSH_CONNECTION": None}, rank
        assert info["cwd"] == "/opt/ml/code" and info["argv"] == ["--msg", "a b"]


def test_nccl_debug_defaults_to_info_and_the_platforms_value_is_kept(tmp_path):
    results = run(job(tmp_path, "", {"NCCL_MIN_NRINGS": "8"}), tmp_path)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    for info in rank_files(results).values():
        assert (info["env"]["NCCL_DEBUG"], info["env"]["NCCL_MIN_NRINGS"]) == ("INFO", "8")
        # these hosts' kernel names are their own: gethostname() is the kernel's, only the accept() shim is preloaded,
        # and the rank's stop library (one stop; its MPI_Abort, during a stop)
        assert info["env"]["LD_PRELOAD"] == f"{native.path_of(native.NETSHIM_LIBRARY)}:{native.path_of(native.RANK_STOP_LIBRARY)}"
        assert info["python"] == info["host"]


def first_lines(results) -> list[str]:
    return [r.failure.splitlines()[0] for r in results]


def test_a_bad_custom_option_fails_every_host_with_mpiruns_own_words(tmp_path):
    results = run(job(tmp_path, "--bogus-option=1"), tmp_path)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    assert first_lines(results) == ['algo-1: mpirun exited with code 1: mpirun: Error: unknown option "--bogus-option=1"'] * 2


@pytest.mark.openmpi5
def test_a_bad_custom_option_under_open_mpi_5(tmp_path):
    path = f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"
    results = run(job(tmp_path, "--bogus-option=1", {"PATH": path}), tmp_path)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    for line in first_lines(results):
        assert line.startswith("algo-1: mpirun exited with code"), line
        assert line.endswith("An unrecognized option was included on the mpirun command line: Option: --bogus-option=1"), line


def test_under_mpijob_the_termination_log_names_mpiruns_error(tmp_path):
    pods = k8s.mpijob("mpj", "ns1", workers=1, slots=2)
    hyper = hps("ranks.py", source(tmp_path), sagemaker_mpi_custom_mpi_options="--bogus-option=1")
    results = k8s.run(pods, tmp_path, hyper, env={**FAST, "TRAINING_TOOLKIT_DNS_TIMEOUT": "20"}, timeout_s=120)
    assert all(r.exit_code not in (0, None) for r in results), [r.exit_code for r in results]
    for pod in pods:
        message = k8s.termination_log(tmp_path / "cluster", pod.name)
        assert 'mpirun: Error: unknown option "--bogus-option=1"' in message.splitlines()[0], message
        assert "-----" not in message, message


OMPI5_RANKS = f"""#!{TOOLKIT_PYTHON}
import json, os, socket, subprocess, sys
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{{rank}}.json"), "w") as f:
    json.dump({{"rank": rank, "python": socket.gethostname(), "uname": os.uname().nodename,
               "c": subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip(),
               "version": os.environ.get("OMPI_VERSION"), "my_var": os.environ.get("MY_VAR"),
               "nccl_debug": os.environ.get("NCCL_DEBUG"), "argv": sys.argv[1:]}}, f)
"""


@pytest.mark.openmpi5
def test_host_names_and_custom_options_under_open_mpi_5_on_hosts_named_aws(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ranks").write_text(OMPI5_RANKS)
    (src / "ranks").chmod(0o755)
    path = f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"
    job = LocalJob(hosts=H2, env={**FAST, "PATH": path},
                   hyperparameters=hps("ranks", src, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2,
                                       sagemaker_mpi_custom_mpi_options="--NCCL_DEBUG=WARN -x MY_VAR=on", msg="a b"))
    results = run(job, tmp_path, before_start=kernel_name_aws)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, info in ranks.items():
        host = H2[rank // 2]
        assert (info["python"], info["c"], info["uname"]) == (host, host, "aws"), info
        assert info["version"].startswith("5.") and (info["my_var"], info["nccl_debug"]) == ("on", "WARN")
        assert info["argv"] == ["--msg", "a b"]


HOROVOD_SCRIPT = """\
import json, os, socket
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd

hvd.init()
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{hvd.rank()}.json"), "w") as f:
    json.dump({"rank": hvd.rank(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
               "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "hostname": socket.gethostname()}, f)
"""


@pytest.mark.horovod
def test_horovod_tells_the_hosts_apart_where_every_kernel_name_is_aws(tmp_path):
    """Horovod's local and cross ranks (from MPI's shared-memory communicator) are right on hosts named aws."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "hvd.py").write_text(HOROVOD_SCRIPT)
    job = LocalJob(hosts=H2, env={**FAST, "TF_CPP_MIN_LOG_LEVEL": "2"},
                   hyperparameters=hps("hvd.py", src, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2))
    results = run(job, tmp_path, timeout_s=240, before_start=kernel_name_aws)
    assert [r.exit_code for r in results] == [0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, info in ranks.items():
        assert (info["local_rank"], info["local_size"], info["cross_rank"], info["cross_size"]) == (rank % 2, 2, rank // 2, 2)
        assert info["hostname"] == info["host"] == H2[rank // 2]
