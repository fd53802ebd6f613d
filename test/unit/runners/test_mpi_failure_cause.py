"""An mpirun that could not start its daemons: the cause is ssh's own line, not Open MPI's help text.

The tail below is Open MPI 4.1.4's real output, captured from the Kubernetes simulation
(test/integration/platforms/test_kubernetes.py) with ``orte_keep_fqdn_hostnames`` left off
under JobSet: ssh was handed the name cut to its first label.
"""

from training_toolkit.supervise.process import ExitStatus
from training_toolkit.job.report import summary_line
from training_toolkit.runners.mpi_failure import describe_mpi_failure

RULE = "-" * 74
OPEN_MPI_4_SSH_FAILURE = [
    "ssh: Could not resolve hostname jsm-workers-0-1: Name or service not known",
    RULE,
    "ORTE was unable to reliably start one or more daemons.",
    "This usually is caused by:",
    "",
    "* an inability to create a connection back to mpirun due to a",
    "  lack of common network interfaces and/or no route found between",
    "  them. Please check network connectivity (including firewalls",
    "  and network routing requirements).",
    RULE,
]


def test_the_rsh_agents_line_is_the_cause():
    assert describe_mpi_failure(OPEN_MPI_4_SSH_FAILURE, ("jsm-workers-0-0.net", "jsm-workers-0-1.net"), 1,
                                ExitStatus(255)) == (
        "jsm-workers-0-0.net: mpirun exited with code 255: ssh: Could not resolve hostname jsm-workers-0-1: "
        "Name or service not known")


def test_the_agents_own_line_is_the_cause_too():
    tail = ["training-toolkit-ssh: TRAINING_TOOLKIT_SSH_CONFIG is not set: this host's job ssh config is not known here",
            *OPEN_MPI_4_SSH_FAILURE[1:]]
    assert describe_mpi_failure(tail, ("algo-1", "algo-2"), 1, ExitStatus(255)) == (
        "algo-1: mpirun exited with code 255: training-toolkit-ssh: TRAINING_TOOLKIT_SSH_CONFIG is not set: "
        "this host's job ssh config is not known here")


def test_a_rule_is_never_the_summary():
    assert summary_line("mpirun exited with code 1", ["try again.", RULE, ""]) == "mpirun exited with code 1: try again."
    assert summary_line("x", [RULE, "=" * 10]) == "x"


def test_dotted_host_names_are_kept_whole_by_either_open_mpi():
    from training_toolkit.runners.mpi_command import MpiJob, mpirun_command

    job = MpiJob(hosts=("js-w-0-0.js", "js-w-0-1.js"), processes_per_host=1, num_processes=2, interface="eth0",
                 rank_command=("/py", "t.py"), rsh_agent=("ssh",))
    four, five = mpirun_command(job, "openmpi4"), mpirun_command(job, "openmpi5")
    assert four[four.index("orte_keep_fqdn_hostnames") - 1:][:3] == ["--mca", "orte_keep_fqdn_hostnames", "1"]
    assert five[five.index("prte_keep_fqdn_hostnames") - 1:][:3] == ["--prtemca", "prte_keep_fqdn_hostnames", "1"]
    assert four[1:3] == five[1:3] == ["--host", "js-w-0-0:1,js-w-0-1.js:1"]  # mpirun's own host by its host name
    bare = MpiJob(**{**job.__dict__, "hosts": ("algo-1", "algo-2")})
    assert not any("fqdn" in arg for arg in mpirun_command(bare, "openmpi4") + mpirun_command(bare, "openmpi5"))
