"""This host's processes: supervised children (``process``), a stop with its grace (``stopping``), the one reader
of ``/proc`` (``procfs``), where runtime files go (``rundir``), and ending processes safely: signals through
pidfds (``pidfd``) and the dead-man switch (``deadman``).

The stop and the supervised children, MPI's switches
(``runners/mpi.py``), ssh's processes (``cluster/ssh``), ``local``'s teardown and its container
reaper use these; docs/teardown.md says how and what they cost.
"""
