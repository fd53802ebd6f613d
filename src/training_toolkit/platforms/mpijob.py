"""mpi-operator v2 MPIJob: a launcher pod that runs mpirun, worker pods that only serve ssh.

What each pod gets (mpi-operator ``pkg/controller/mpi_job_controller.go``):
``K_MPI_JOB_ROLE=launcher|worker``; the ConfigMap ``<job>-config`` at ``/etc/mpi`` with
``hostfile`` (``<job>-worker-<i>.<job>.<ns>.svc slots=<slotsPerWorker>``, the launcher
first when ``runLauncherAsWorker: true``) and ``discover_hosts.sh``; the secret
``<job>-ssh`` (an ECDSA key, named ``id_rsa``, ``id_rsa.pub`` and ``authorized_keys``)
mounted at ``sshAuthMountPath`` (``/root/.ssh``), 0644 unless ``defaultMode`` says
otherwise; ``OMPI_MCA_orte_default_hostfile`` and ``OMPI_MCA_orte_keep_fqdn_hostnames``.

Mapping: the hostfile's names in its order are the hosts; the launcher must be the first
(``runLauncherAsWorker: true``), since the toolkit's MPI runner runs ranks on the host that
runs mpirun.  Every pod runs ``train``: the launcher runs mpirun, the workers keep only the
toolkit's sshd and report through the control channel.  The job's key is the mounted one;
no host key is mounted, so each pod makes its own and the channel's introductions pin it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType

from training_toolkit import names
from training_toolkit.cluster.ssh import keys
from training_toolkit.errors import ConfigError
from training_toolkit.platforms.view import MPIJOB, PodView

ROLE = "K_MPI_JOB_ROLE"
LAUNCHER, WORKER = "launcher", "worker"
HOSTFILE = "/etc/mpi/hostfile"
HOSTFILE_VARIABLE = "OMPI_MCA_orte_default_hostfile"  # the operator points Open MPI at its hostfile
SSH_DIR = "/root/.ssh"  # mpi-operator's default sshAuthMountPath
PRIVATE, PUBLIC = "id_rsa", "id_rsa.pub"


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


def view(environ: Mapping[str, str], hostfile: str | None, hostname: str) -> PodView:
    role = environ.get(ROLE)
    if role not in (LAUNCHER, WORKER):
        raise ConfigError(f"environment variable {ROLE}", None, f"expected {LAUNCHER} or {WORKER}, got {role!r}")
    if hostfile is None:
        raise ConfigError(HOSTFILE, None, "missing: mpi-operator mounts its ConfigMap at /etc/mpi")
    hosts, slots = parse_hostfile(hostfile)
    mine = [h for h in hosts if h.split(".", 1)[0] == hostname]
    if not mine:
        hint = (" (set runLauncherAsWorker: true: the toolkit's MPI runner runs ranks on the launcher too)"
                if role == LAUNCHER else "")
        raise ConfigError(HOSTFILE, None, f"does not list this pod, {hostname}{hint}")
    if role == LAUNCHER and mine[0] != hosts[0]:
        raise ConfigError(HOSTFILE, None, f"the launcher {hostname} must be the first host")
    params = {names.distribution("mpi").switch: True, names.MPI_PROCESSES_PER_HOST: slots}
    return PodView(MPIJOB, hosts, mine[0], MappingProxyType(params))


def key_files(private: bytes, public: str, host_key: keys.KeyPair) -> dict[str, bytes]:
    """The toolkit's key directory (``TRAINING_TOOLKIT_SSH_KEYS``) from mpi-operator's secret and a fresh host key."""
    return {keys.MOUNTED_CLIENT_KEY: private, keys.MOUNTED_CLIENT_PUBLIC: public.encode(),
            keys.MOUNTED_HOST_KEY: host_key.private, keys.MOUNTED_HOST_PUBLIC: (host_key.public + "\n").encode()}


def job_secret(private: bytes) -> str:
    """A secret every pod of the job holds and nobody outside it does: derived from the job's private key."""
    return hashlib.sha256(b"training-toolkit mpijob channel secret\0" + private.strip()).hexdigest()
