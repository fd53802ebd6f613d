"""mpi-operator v2 MPIJob: a launcher pod that runs mpirun, worker pods that only serve ssh.

What each pod gets (mpi-operator ``pkg/controller/mpi_job_controller.go``, v0.8.2):

- the launcher: ``K_MPI_JOB_ROLE=launcher``, ``OMPI_MCA_orte_default_hostfile`` and the
  ConfigMap ``<job>-config`` at ``/etc/mpi`` (``hostfile``: ``<pod>.<job>.<ns>.svc slots=N``,
  the launcher first when ``runLauncherAsWorker: true``), hostname ``<job>-launcher``;
- a worker: ``K_MPI_JOB_ROLE=worker`` **and nothing else** (no hostfile), hostname
  ``<job>-worker-<i>``, subdomain ``<job>``, so the kubelet's ``/etc/hosts`` holds its FQDN
  ``<job>-worker-<i>.<job>.<ns>.svc.<domain>``;
- every pod: the secret ``<job>-ssh`` (an ECDSA key as ``id_rsa``, ``id_rsa.pub``,
  ``authorized_keys``, no host key) at ``sshAuthMountPath`` (``/root/.ssh``, mode 0600 there; the toolkit reads it there).
A job that sets ``TRAINING_TOOLKIT_SSH_KEYS`` uses its own keys instead, in the toolkit's naming.

Mapping: the launcher's hosts are the hostfile's, in order; it must be the first
(``runLauncherAsWorker: true``), since the toolkit's MPI runner runs ranks on the host that runs
mpirun.  A worker finds the launcher from its own FQDN (same job, same subdomain and
namespace) and knows itself, and nothing names the other workers: its view lists those two hosts,
enough to wait for their names and join the launcher's control channel.  The job's hosts then
come from the launcher's welcome, and the worker's job is rebuilt from them before anything is
prepared (``membership.job_hosts``, ``runspec.with_hosts``): its ranks, its shim's allow list
and its sshd's ``from=`` name every pod, never the two it could see.  The job's
client key is the mounted one, read under the operator's names; each pod makes its own host key
(the channel's introductions pin it); the channel's secret is derived from the mounted key,
which every pod of the job holds and nobody outside it does.
"""

from __future__ import annotations

import re
from types import MappingProxyType

from training_toolkit.core import names
from training_toolkit.core.errors import ConfigError
from training_toolkit.platforms.kubernetes import GRACE_S, PodPlatform, in_a_pod, pod_name
from training_toolkit.platforms.view import Facts
from training_toolkit.config.settings import KeyFiles, Overrides

ROLE = "K_MPI_JOB_ROLE"
LAUNCHER, WORKER = "launcher", "worker"
HOSTFILE = "/etc/mpi/hostfile"
HOSTFILE_VARIABLE = "OMPI_MCA_orte_default_hostfile"  # the operator points Open MPI at its hostfile (launcher only)
SSH_DIR = "/root/.ssh"  # mpi-operator's default sshAuthMountPath
PRIVATE, PUBLIC = "id_rsa", "id_rsa.pub"
_WORKER_NAME = re.compile(r"^(?P<job>.+)-worker-(?P<index>\d+)$")


class MPIJob(PodPlatform):
    name = "mpijob"

    def detected(self, facts: Facts) -> bool:
        return in_a_pod(facts) and bool(facts.environ.get(ROLE))

    def hosts_of(self, facts: Facts):
        role = facts.environ.get(ROLE)
        if role == LAUNCHER:
            path = facts.environ.get(HOSTFILE_VARIABLE) or HOSTFILE
            text = facts.read(path)
            if text is None:
                raise ConfigError(path, None, "missing: mpi-operator mounts its ConfigMap at /etc/mpi on the launcher")
            hosts, current, slots = launcher_view(text, facts.hostname, path)
            params = {names.distribution("mpi").switch: True, names.MPI_PROCESSES_PER_HOST: slots}
        elif role == WORKER:
            name = pod_name(facts)
            hosts, current = worker_view(facts.hostname, name.subdomain, name.namespace)
            params = {names.distribution("mpi").switch: True}
        else:
            raise ConfigError(f"environment variable {ROLE}", None, f"expected {LAUNCHER} or {WORKER}, got {role!r}")
        return hosts, current, MappingProxyType(params), 0

    def overrides(self, facts: Facts) -> Overrides:
        if facts.settings.ssh_keys is not None:  # the job mounts keys of its own, in the toolkit's naming
            return Overrides(grace_s=GRACE_S)
        private = facts.read(f"{SSH_DIR}/{PRIVATE}")
        if private is None:
            raise ConfigError(f"{SSH_DIR}/{PRIVATE}", None, "missing: mpi-operator mounts the job's ssh secret at "
                              "sshAuthMountPath, which must be /root/.ssh (its default) for the toolkit to find it")
        return Overrides(grace_s=GRACE_S, ssh_keys=KeyFiles(SSH_DIR, PRIVATE, PUBLIC, None, None),
                         job_secret=job_secret(private.encode()))


def parse_hostfile(text: str, source: str = HOSTFILE) -> tuple[tuple[str, ...], int]:
    """Host names in order, and the slots every host has (one number for all)."""
    hosts, slots = [], set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, *rest = line.split()
        count = 1
        for item in rest:
            key, _, value = item.partition("=")
            if key in ("slots", "max_slots") and not value.isdigit():
                raise ConfigError(source, f"line {number}", f"expected slots=N, got {item!r}")
            if key == "slots":
                count = int(value)
        hosts.append(name)
        slots.add(count)
    if not hosts:
        raise ConfigError(source, None, "no hosts")
    if len(slots) != 1:
        raise ConfigError(source, "slots", f"expected the same slots on every host, got {sorted(slots)}")
    return tuple(hosts), slots.pop()


def launcher_view(hostfile: str, hostname: str, source: str = HOSTFILE) -> tuple[tuple[str, ...], str, int]:
    hosts, slots = parse_hostfile(hostfile, source)
    if hosts[0].split(".", 1)[0] != hostname:
        listed = any(h.split(".", 1)[0] == hostname for h in hosts)
        problem = (f"the launcher {hostname} must be the first host" if listed else
                   f"does not list this pod, {hostname} (set runLauncherAsWorker: true: the toolkit's MPI runner "
                   "runs ranks on the launcher too)")
        raise ConfigError(source, None, problem)
    return hosts, hosts[0], slots


def worker_view(hostname: str, subdomain: str | None, namespace: str | None) -> tuple[tuple[str, ...], str]:
    """A worker's own view: the launcher and itself, named as the launcher's hostfile names them.

    Only enough to join: the job's hosts come from the launcher's welcome (``membership.job_hosts``).
    """
    match = _WORKER_NAME.match(hostname)
    if not match:
        raise ConfigError("MPIJob worker", "hostname", f"expected <job>-worker-<i>, got {hostname!r}")
    job = match["job"]
    if subdomain != job or not namespace:
        raise ConfigError("/etc/hosts", None, f"no line names this pod as {hostname}.{job}.<namespace>.svc: "
                          "mpi-operator gives every worker the subdomain of its job")
    suffix = f"{job}.{namespace}.svc"
    return (f"{job}-launcher.{suffix}", f"{hostname}.{suffix}"), f"{hostname}.{suffix}"


def job_secret(private: bytes) -> bytes:
    """A secret every pod of the job holds and nobody outside it does: derived from the job's private key."""
    import hashlib  # in an MPIJob pod only: off every other platform's launch path

    return hashlib.sha256(b"training-toolkit mpijob channel secret\0" + private.strip()).hexdigest().encode()
