"""The agent: the one shell every runner runs in, on every host (a job of one seat included).

``loop`` is the shell (``HostAgent``, ``run``): what happens becomes an event
(``events``), the pure ``decisions.step`` says what it means, the shell carries
out the actions (``actions``).  The rules are split by the part they decide:
``state`` (what a host knows), ``failures`` (what failed, and the one
root-cause rule), ``barrier`` (the lead's barrier), ``lead`` (the first
host while an attempt runs), ``follow`` (the followers), ``verdicts``.
``stall`` and ``progress`` watch for stalls; ``seats``
is who takes part in each attempt (and the seat of a job of one host);
``parts`` stops and watches this host's processes.

Nothing is imported here: a module of the package imports only what it uses.
"""
