
from training_toolkit.supervise.process import ExitStatus
from training_toolkit.runners.mpi_failure import describe_mpi_failure
from training_toolkit.runners.mpi_command import MpiJob, host_list, mpirun_command

RANK = ("/venv/native/training-toolkit-rank",)
JOB = MpiJob(hosts=("algo-1", "algo-2"), processes_per_host=2, num_processes=4, interface="eth0",
             rank_command=RANK, rsh_agent=("/opt/tt/native/training-toolkit-ssh",),
             term_blocked="/opt/tt/native/training-toolkit-term-blocked",
             custom_options=("--mca", "btl_tcp_eager_limit", "1024"), as_root=True)

# the BTL's listeners in the range the listener guard filters (cluster/guard.py), whatever the flavour
BTL_PORTS = ("--mca", "btl_tcp_port_min_v4", "31000", "--mca", "btl_tcp_port_range_v4", "1000",
             "--mca", "btl_tcp_port_min_v6", "31000", "--mca", "btl_tcp_port_range_v6", "1000")


def test_openmpi4_command_exactly():
    assert mpirun_command(JOB, "openmpi4") == [
        "mpirun", "--host", "algo-1:2,algo-2:2", "-np", "4", "--allow-run-as-root", "--tag-output",
        "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
        "--mca", "plm_rsh_agent", "/opt/tt/native/training-toolkit-ssh", "--mca", "routed_radix", "64",
        "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "^openib",
        *BTL_PORTS,
        "--mca", "orte_abort_on_non_zero_status", "1", "--mca", "odls_base_sigkill_timeout", "0",
        "--mca", "orte_launch_agent", "env --block-signal=TERM orted",
        "--mca", "btl_tcp_eager_limit", "1024", *RANK,
    ]


def test_openmpi5_command_exactly():
    job = MpiJob(**{**JOB.__dict__, "as_root": False, "custom_options": ()})
    assert mpirun_command(job, "openmpi5", mpirun="/opt/bin/mpirun") == [
        "/opt/bin/mpirun", "--host", "algo-1:2,algo-2:2", "-np", "4", "--output", "tag",
        "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
        "--mca", "plm_ssh_agent", "/opt/tt/native/training-toolkit-ssh", "--prtemca", "routed_radix", "64",
        "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp",
        *BTL_PORTS, "--prtemca", "prte_launch_agent", "/opt/tt/native/training-toolkit-term-blocked prted", *RANK,
    ]


def test_through_slurm_no_rsh_agent_but_plm_slurm_with_overlap():
    """Under Slurm the daemons start with srun inside the job's step: nothing of ssh on the line (docs/slurm.md)."""
    slurm = MpiJob(**{**JOB.__dict__, "rsh_agent": (), "via_slurm": True, "custom_options": ()})
    four = mpirun_command(slurm, "openmpi4")
    # ranks placed by name, in the given order (Slurm's allocation order is not the seating's): map-by seq
    assert four[1:5] == ["--host", "algo-1,algo-1,algo-2,algo-2", "-np", "4"]
    assert four[21:23] == ["--map-by", "seq"]
    assert four[7:19] == ["--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                          "--mca", "plm", "slurm", "--mca", "plm_slurm_args", "--overlap"]
    assert four[19:21] == ["--bind-to", "none"] and not any("rsh" in arg or "ssh" in arg for arg in four)
    # the daemons start as over ssh: SIGTERM blocked (Slurm's scancel and --time signal every process of a step)
    assert four[four.index("orte_launch_agent") + 1] == "env --block-signal=TERM orted"
    # Open MPI 4's libfabric BTL left out (1 s in every rank's MPI_Finalize here), unless the options name a list
    assert four[four.index("btl", 21) + 1] == "^openib,ofi"
    own = mpirun_command(MpiJob(**{**slurm.__dict__, "custom_options": ("--mca", "btl", "self,vader,tcp,ofi")}))
    assert [own[i + 1] for i, word in enumerate(own) if word == "btl"] == ["self,vader,tcp,ofi"]
    five = mpirun_command(slurm, "openmpi5")
    assert five[2] == "algo-1,algo-1,algo-2,algo-2" and five[five.index("--map-by") + 1] == "seq"
    assert five[five.index("btl", 21) + 1] == "self,sm,tcp"
    assert five[8:20] == ["--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                          "--prtemca", "plm", "slurm", "--prtemca", "plm_slurm_args", "--overlap"]
    assert not any("ssh" in arg for arg in five)


def test_host_list_table():
    for hosts, per, by_name, expected in [
        (("a", "b"), 2, False, "a:2,b:2"),
        (("a", "b"), 2, True, "a,a,b,b"),
        (("b", "a", "c"), 1, True, "b,a,c"),  # the given order, never sorted
        (("b", "a", "c"), 3, False, "b:3,a:3,c:3"),
        (("a",), 3, True, "a,a,a"),
    ]:
        assert host_list(hosts, per, by_name) == expected


def test_one_host_and_many_hosts():
    one = MpiJob(**{**JOB.__dict__, "hosts": ("algo-1",), "num_processes": 2})
    assert mpirun_command(one)[1:5] == ["--host", "algo-1:2", "-np", "2"]
    many = MpiJob(**{**JOB.__dict__, "hosts": tuple(f"algo-{i}" for i in range(1, 9)), "processes_per_host": 8,
                     "num_processes": 64})
    assert mpirun_command(many)[2] == ",".join(f"algo-{i}:8" for i in range(1, 9))


HOSTS = ("algo-1", "algo-2", "algo-3")


def test_describe_signal_death_from_mpirun_report():
    tail = ["[1,0]<stdout>:hello",
            "mpirun noticed that process rank 5 with PID 0 on node algo-3 exited on signal 9 (Killed)."]
    assert describe_mpi_failure(tail, HOSTS, 2, ExitStatus(137)) == \
        "rank 5 on algo-3 killed by SIGKILL: likely out of memory (exit code 137)"


def test_describe_abort_with_the_ranks_exception():
    tail = ["[1,3]<stderr>:Traceback (most recent call last):", "[1,3]<stderr>:ValueError: boom",
            "[1,1]<stderr>:unrelated", "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD"]
    assert describe_mpi_failure(tail, HOSTS, 2, ExitStatus(1)) == "rank 3 on algo-2 called MPI_Abort: ValueError: boom"


def test_describe_non_zero_exit_and_unknown():
    tail = ["[1,4]<stderr>:oops", "  Process name: [[6491,1],4]", "  Exit code:    3"]
    assert describe_mpi_failure(tail, HOSTS, 2, ExitStatus(3)) == "rank 4 on algo-3 exited with code 3: oops"
    assert describe_mpi_failure(["ssh: connect failed"], HOSTS, 2, ExitStatus(255)) == \
        "algo-1: mpirun exited with code 255: ssh: connect failed"


def test_describe_open_mpi_5_reports():
    """prterun's own words (Open MPI 5.0.11), wrapped where it wraps them."""
    killed = ["[1,0]<stdout>: hello", "-" * 74,
              "prterun noticed that process rank 3 with PID 941 on node algo-2 exited on",
              "signal 9 (Killed).", "-" * 74]
    assert describe_mpi_failure(killed, HOSTS, 2, ExitStatus(137)) == \
        "rank 3 on algo-2 killed by SIGKILL: likely out of memory (exit code 137)"
    failed = ["[1,3]<stderr>: ValueError: rank 3 was told to fail", "-" * 74,
              "prterun detected that one or more processes exited with non-zero status,",
              "thus causing the job to be terminated. The first process to do so was:", "",
              "   Process name: [prterun-algo-1-685@1,3]", "   Exit code:    1", "-" * 74,
              "[1,3]<stderr>:  [1,0]<stderr>:  [1,2]<stderr>:  "]
    assert describe_mpi_failure(failed, HOSTS, 2, ExitStatus(1)) == \
        "rank 3 on algo-2 exited with code 1: ValueError: rank 3 was told to fail"
