"""Ending processes safely: signals through pidfds (``pidfd``) and the dead-man switch (``deadman``).

The stop with the grace (``stopping``), supervised children (``process``) and the reader of the
process table (``procfs``) use these; docs/architecture.md's module map places them.
"""
