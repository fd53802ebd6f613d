"""Passwordless SSH between the hosts of one job, set up per job and pinned.

MPI launchers start remote ranks over ssh.  The usual recipes bake a key into
the image and switch host-key checking off; both leak trust beyond the job.
Here every piece is per job and lives in a new private directory of our own
(never ``~/.ssh``, which belongs to the user and may be read-only or shared):

* keys are generated for the job on the host that uses them (``keys``), or
  read from a mounted secret; only public keys travel between hosts;
* our sshd runs with its own config (``-f``), never the system one, so a base
  image's ``/etc/ssh`` cannot weaken or break it, and admits the job's client
  key only, from the job's hosts only, for nothing but a command (``config``);
* clients use ``ssh -F <our config>`` (Open MPI through ``training-toolkit-ssh``,
  native/ssh_agent.c, the same agent string on every host), which also skips ``/etc/ssh/ssh_config``
  and ``~/.ssh/config``; each peer's host key is pinned in our ``known_hosts``
  under every name it is reached by, so there is never a prompt and never
  ``StrictHostKeyChecking no``.

Modules: ``keys`` (key pairs), ``config`` (exact file texts), ``layout``
(the directory and its files), ``sshd`` (the daemon's lifecycle), ``probe``
(waiting for peers), ``errors``.  Import each name from its own module: this package re-exports
nothing.
"""
