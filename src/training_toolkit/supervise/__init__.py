"""Ending processes safely: signals through pidfds (``pidfd``) and the dead-man switch (``deadman``).

The stop with the grace (``stopping``), supervised children (``process``), MPI's switches
(``runners/mpi.py``), ssh's processes (``cluster/ssh``), ``local``'s teardown and its container
reaper use these; docs/teardown.md says how and what they cost.
"""
