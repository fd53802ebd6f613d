"""Open stand-ins for SageMaker's distributed data parallel library (``smdistributed.dataparallel``).

A script written for the library runs after changing only its import line, e.g.
``import training_toolkit.dataparallel.tensorflow as sdp``.  The collectives come
from Horovod over MPI (or Gloo) instead of the vendor's closed NCCL backend, so the
same script also runs on CPU-only machines.  See docs/dataparallel.md.
"""
