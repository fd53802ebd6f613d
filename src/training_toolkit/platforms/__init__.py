"""Platforms: adapters at the edge that only produce the job's ``/opt/ml`` view and its environment.

SageMaker hands ``train`` a finished ``/opt/ml``: nothing to adapt.  Kubernetes
operators hand each pod other facts (``TF_CONFIG``, ``MASTER_ADDR``/``PET_*``,
an MPI hostfile, JobSet labels); ``kubernetes.py`` turns them into the same
``/opt/ml`` view, and the runners never know which platform they are on.
"""
