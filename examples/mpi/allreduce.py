"""An mpi4py example: every rank contributes its rank; all must agree on the sum."""

import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank(), op=MPI.SUM)
print(f"rank {comm.Get_rank()} of {comm.Get_size()} on {socket.gethostname()} "
      f"(SM_CURRENT_HOST={os.environ['SM_CURRENT_HOST']}): sum of ranks = {total}")
assert total == comm.Get_size() * (comm.Get_size() - 1) // 2
