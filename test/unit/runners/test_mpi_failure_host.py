"""Whose failure mpirun's end is: the failing rank's host, as data (``mpi_failure``), for the retire rule.

mpirun runs on the first host for every rank, so the agent's own view of the failure is always the first
host's; the runner tells it the rank's host instead (``runspec.Blamed``, ``LocalExit.host``).
"""

import pytest

from training_toolkit.supervise.process import ExitStatus
from training_toolkit.runners.mpi_failure import MpiFailure, mpi_failure

HOSTS = ("algo-1", "algo-2", "algo-3")
RULE = "-" * 74
ABORT_3 = ["[1,3]<stderr>:ValueError: boom", "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD"]


@pytest.mark.parametrize("tail, hosts, per_host, status, want", [
    # Open MPI 4 names the node of a rank killed by a signal: that node
    (["mpirun noticed that process rank 5 with PID 0 on node algo-3 exited on signal 9 (Killed)."], HOSTS, 2, 137,
     MpiFailure("rank 5 on algo-3 killed by SIGKILL: likely out of memory (exit code 137)", "algo-3")),
    # a node named otherwise than the job names its hosts: the text keeps mpirun's name, the host is the rank's slot
    (["mpirun noticed that process rank 5 with PID 0 on node algo-3.cluster exited on signal 9 (Killed)."], HOSTS, 2,
     137, MpiFailure("rank 5 on algo-3.cluster killed by SIGKILL: likely out of memory (exit code 137)", "algo-3")),
    # MPI_Abort names the rank only: its host by slot (2 ranks a host, in the attempt's order)
    (ABORT_3, HOSTS, 2, 1, MpiFailure("rank 3 on algo-2 called MPI_Abort: ValueError: boom", "algo-2")),
    # the attempt's hosts, a spare in algo-2's seat: its ranks are 2 and 3
    (ABORT_3, ("algo-1", "algo-4", "algo-3"), 2, 1,
     MpiFailure("rank 3 on algo-4 called MPI_Abort: ValueError: boom", "algo-4")),
    # one rank a host (Horovod)
    (ABORT_3, ("algo-1", "algo-2", "algo-3", "algo-4"), 1, 1,
     MpiFailure("rank 3 on algo-4 called MPI_Abort: ValueError: boom", "algo-4")),
    # Open MPI 4's first non-zero exit
    (["[1,4]<stderr>:oops", "  Process name: [[6491,1],4]", "  Exit code:    3"], HOSTS, 2, 3,
     MpiFailure("rank 4 on algo-3 exited with code 3: oops", "algo-3")),
    # Open MPI 5's (prterun) first non-zero exit
    ([RULE, "   Process name: [prterun-algo-1-685@1,1]", "   Exit code:    1", RULE], HOSTS, 2, 1,
     MpiFailure("rank 1 on algo-1 exited with code 1", "algo-1")),
    # a rank past the attempt's slots (a report not of this attempt's layout): no host blamed
    (["MPI_ABORT was invoked on rank 9 in communicator MPI_COMM_WORLD"], HOSTS, 2, 1,
     MpiFailure("rank 9 on ? called MPI_Abort", None)),
    # mpirun's own end, no rank named: no host blamed (the agent's default: this host, the first)
    (["ssh: connect failed"], HOSTS, 2, 255, MpiFailure("algo-1: mpirun exited with code 255: ssh: connect failed")),
    ([RULE, "ORTE has lost communication with a remote daemon.", RULE], HOSTS, 2, 205,
     MpiFailure("algo-1: mpirun lost a daemon and ended the job: ORTE has lost communication with a remote daemon.")),
])
def test_the_failing_ranks_host_is_data(tail, hosts, per_host, status, want):
    assert mpi_failure(tail, hosts, per_host, ExitStatus(status)) == want
