"""mpirun's own reason when no rank is at fault: the line that says why, never a banner or the usage hint."""

from __future__ import annotations

from training_toolkit.supervise.process import ExitStatus
from training_toolkit.runners.mpi_failure import LOST_DAEMON_EXIT, describe_mpi_failure, lost_a_daemon, mpirun_reason

DASHES = "-" * 74
HOSTS = ("algo-1", "algo-2")

# what Open MPI 4.1.4 (Debian) and 5.0 (the wheel) print, captured here
OMPI4_UNKNOWN_OPTION = ['mpirun: Error: unknown option "--NCCL_DEBUG=WARN"', "Type 'mpirun --help' for usage."]
OMPI5_UNKNOWN_OPTION = [DASHES, "An unrecognized option was included on the mpirun command line:", "",
                        "  Option: --NCCL_DEBUG=WARN", "", 'Please use the "mpirun --help" command to obtain a list of all',
                        "supported options.", DASHES]
SSH_UNRESOLVED = ["ssh: Could not resolve hostname nosuchhost: Name or service not known", DASHES,
                  "ORTE was unable to reliably start one or more daemons.", "This usually is caused by:", "",
                  "* not finding the required libraries and/or binaries on", "  one or more nodes.", DASHES]


def test_open_mpi_4_error_line_not_the_usage_hint():
    assert mpirun_reason(OMPI4_UNKNOWN_OPTION) == 'mpirun: Error: unknown option "--NCCL_DEBUG=WARN"'
    assert describe_mpi_failure(OMPI4_UNKNOWN_OPTION, HOSTS, 2, ExitStatus(1)) == \
        'algo-1: mpirun exited with code 1: mpirun: Error: unknown option "--NCCL_DEBUG=WARN"'


def test_open_mpi_5_help_block_summary_and_detail():
    assert mpirun_reason(OMPI5_UNKNOWN_OPTION) == \
        "An unrecognized option was included on the mpirun command line: Option: --NCCL_DEBUG=WARN"


def test_a_programs_own_line_before_the_banner_wins():
    assert mpirun_reason(SSH_UNRESOLVED) == "ssh: Could not resolve hostname nosuchhost: Name or service not known"
    assert mpirun_reason(SSH_UNRESOLVED[1:]) == ("ORTE was unable to reliably start one or more daemons. This usually is "
                                                 "caused by: * not finding the required libraries and/or binaries on "
                                                 "one or more nodes.")


def test_the_agents_line_wins_over_open_mpis_own_warnings():
    tail = ["ssh: connect to host algo-2 port 22: Connection refused",
            "[algo-1:00020] plm:ssh: Warning: setpgid(25,25) failed in parent with errno=Permission denied(13)", *SSH_UNRESOLVED[1:]]
    assert mpirun_reason(tail) == "ssh: connect to host algo-2 port 22: Connection refused"
    assert mpirun_reason(["a line of its own", "[algo-1:00020] Warning: x", DASHES, "Block.", DASHES]) == "a line of its own"
    assert mpirun_reason(["[algo-1:00020] Warning: x", DASHES, "Block.", DASHES]) == "Block."


def test_rank_output_and_bare_tags_are_not_mpiruns_reason():
    assert mpirun_reason(["[1,0]<stderr>:Traceback", "[1,0]<stdout>:", ""]) is None
    assert describe_mpi_failure([DASHES, DASHES], HOSTS, 2, ExitStatus(1)) == "algo-1: mpirun exited with code 1"


# help-errmgr-base.txt [node-died], as Open MPI 5.0.11's prterun prints it (then exits 0), and Open MPI 4.1.4's
PRTE_NODE_DIED = [DASHES, "PRTE has lost communication with a remote daemon.", "",
                  "  HNP daemon   : [prterun-algo-1-24@0,0] on node algo-1",
                  "  Remote daemon: [prterun-algo-1-24@0,1] on node algo-2", "",
                  "This is usually due to either a failure of the TCP network", "connection to the node, or possibly an "
                  "internal failure of", "the daemon itself. We cannot recover from this failure, and",
                  "therefore will terminate the job.", DASHES]
ORTE_NODE_DIED = [DASHES, "ORTE has lost communication with a remote daemon.", "",
                  "  HNP daemon   : [[1234,0],0] on node algo-1", "  Remote daemon: [[1234,0],1] on node algo-2", "",
                  "This is usually due to either a failure of the TCP network", DASHES]


def test_a_lost_daemon_is_no_success_whatever_mpirun_exits_with():
    assert lost_a_daemon(PRTE_NODE_DIED) and lost_a_daemon(ORTE_NODE_DIED)
    assert lost_a_daemon(["[1,0]<stdout>:step 3"] + PRTE_NODE_DIED[:1] + ["PRTE has lost communication with a", "remote daemon."])
    assert not lost_a_daemon(OMPI5_UNKNOWN_OPTION) and not lost_a_daemon(SSH_UNRESOLVED) and not lost_a_daemon([])
    assert describe_mpi_failure(PRTE_NODE_DIED, HOSTS, 2, ExitStatus(LOST_DAEMON_EXIT)) == \
        "algo-1: mpirun lost a daemon and ended the job: PRTE has lost communication with a remote daemon."
    assert describe_mpi_failure(ORTE_NODE_DIED, HOSTS, 2, ExitStatus(205)) == \
        "algo-1: mpirun lost a daemon and ended the job: ORTE has lost communication with a remote daemon."
