"""Kubernetes operators simulated on a local namespace cluster: each pod gets what its operator gives, no more.

Built fact by fact from docs/kubernetes.md, which records what each operator gives a pod (read
from the operators' source).  Per pod (a namespace host whose hostname is the pod's):

- its variables: the kubelet's ``KUBERNETES_SERVICE_*``/``KUBERNETES_PORT*`` and ``HOSTNAME``,
  the operator's (to the containers that get them), and what the manifest itself sets (the
  downward-API variables of our JobSet manifest, ``TRAINING_TOOLKIT_*``);
- its volumes at their real paths (``/etc/mpi``, ``/root/.ssh``, ``/etc/training-toolkit``),
  read-only, laid out as the kubelet's atomic writer does (``..data`` -> ``..<timestamp>/``,
  each key a symlink), with the operator's modes; an overlay over ``/etc`` and a tmpfs over
  ``/root`` in the pod's own mount namespace make room for them, so nothing reaches the machine;
- the kubelet's ``/etc/hosts`` (localhost, then this pod's own line: its FQDN only when it has
  a subdomain) and a ``resolv.conf`` with the namespace's search path (MPIJob workers: their
  job's domain first) and ``ndots:5``;
- cluster DNS: a real DNS server (``kube_dns.py``) on a host of its own that answers only the
  records the operator's Services make (per-pod Services for TFJob and PyTorchJob, the job's
  headless Service for MPIJob, JobSet and an indexed Job), each added when its pod's container
  starts and removed when it ends; a bare name resolves only through the search path, as in a pod.

The one liberty: the termination log is not ``/dev/termination-log`` (a file there would be
made on the machine's own ``/dev``) but a file in the pod's directory, named by
``TRAINING_TOOLKIT_TERMINATION_LOG``.  Not simulated: PyTorchJob's init container that waits
for the master's name (the toolkit waits for every name itself) and the operators' status.
Restarts: a container restarted in its pod (``restartPolicy``, the kubelet's back-off, the
operator's ``backoffLimit``) is ``helpers/kubelet.py``; a JobSet restart is the same pods
made again with the next ``restart-attempt`` (``jobset(..., attempt=N)``), fresh.  A pod deleted
and made again under its name (its node lost; the operator recreates a missing replica's pod) is
``run(..., operator=...)``: the same name, a new address (its DNS record moves with it), a fresh
emptyDir ``/opt/ml``, fresh ``/run`` and ``/dev/shm``, and the kubelet's ``/etc/hosts`` for the
new address.  Nothing here is a real cluster.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from helpers.multihost import run as run_job
from training_toolkit.local.job import INTERFACE, host_tree
from training_toolkit.local.launcher import LocalJob

API_SERVER = "192.0.2.1"  # what the kubelet puts in KUBERNETES_SERVICE_HOST; never contacted here
DNS_HOST = "kube-dns"
DNS_RECORD = "kube-dns.kube-system.svc.cluster.local"  # the cluster DNS's own name: how the test knows it answers
CLUSTER_DOMAIN = "cluster.local"
HP_MOUNT = "/etc/training-toolkit"  # where our manifests mount the hyperparameters ConfigMap
TIMESTAMP_DIR = "..2026_11_25_00_00_00.000000001"


@dataclass
class Volume:
    """A secret or ConfigMap volume: key -> (content, mode)."""

    files: dict[str, tuple[bytes, int]]


@dataclass
class Pod:
    name: str  # the pod's hostname
    namespace: str
    env: dict[str, str] = field(default_factory=dict)
    subdomain: str | None = None
    records: tuple[str, ...] = ()  # FQDNs cluster DNS answers with this pod's address while its container runs
    search: tuple[str, ...] = ()  # search domains before the namespace's (mpi-operator gives workers one)
    volumes: dict[str, Volume] = field(default_factory=dict)  # mount path -> volume
    scheduled: bool = True  # False: never scheduled, so never started and never in DNS


def k8s_dir(workdir: Path, pod: str) -> Path:
    return workdir / pod / "k8s"


def termination_log(workdir: Path, pod: str) -> str:
    return (k8s_dir(workdir, pod) / "termination-log").read_text()


SUMMARY = "training-toolkit: summary: "


def termination_verdict(workdir: Path, pod: str) -> str:
    """The termination message without the job's summary line after the verdict (every pod that wrote a verdict has
    one: asserted here, so a test of the verdict's words also sees that the summary followed it)."""
    message = termination_log(workdir, pod)
    head, found, summary = message.partition("\n" + SUMMARY)
    assert found and summary.endswith("\n") and "\n" not in summary[:-1], message
    return head + "\n"


def kubelet_hosts(pod: Pod, address: str) -> str:
    """``managedHostsFileContent``: localhost lines, then this pod's own line."""
    own = f"{address}\t{pod.name}.{pod.subdomain}.{pod.namespace}.svc.{CLUSTER_DOMAIN}\t{pod.name}" if pod.subdomain \
        else f"{address}\t{pod.name}"
    return ("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            "fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n"
            f"{own}\n")


def resolv_conf(pod: Pod, nameserver: str) -> str:
    ns = pod.namespace
    search = [*pod.search, f"{ns}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN]
    return f"search {' '.join(search)}\nnameserver {nameserver}\noptions ndots:5\n"


def write_volume(directory: Path, volume: Volume) -> None:
    """The kubelet's atomic writer: the keys in a timestamped directory, ``..data`` to it, a symlink per key."""
    data = directory / TIMESTAMP_DIR
    data.mkdir(parents=True)
    for key, (content, mode) in volume.files.items():
        (data / key).write_bytes(content)
        os.chmod(data / key, mode)
    os.symlink(TIMESTAMP_DIR, directory / "..data")
    for key in volume.files:
        os.symlink(f"..data/{key}", directory / key)


# Run in the pod's mount namespace as `sh -c SCRIPT pod ETC_MODE K8S_DIR KEEP MOUNT...`: room for the volumes (an
# overlay over /etc whose upper layer holds the kubelet's hosts and resolv.conf, a tmpfs over /root),
# then each volume bind-mounted read-only at its path.  Inside a container (a CI runner's), /etc is
# itself on overlayfs, which the kernel refuses as an overlay's lower layer ("wrong fs type"): there
# the pod gets a private copy of /etc with the same two files, bound in place, which a pod sees the
# same way.  ETC_MODE "copy" takes the copy everywhere (to test that path where overlay works).
# KEEP: colon-separated directories under /root that the pod must still see through its fresh /root
# (the checkout and its venv, where a CI runner's container keeps them in /root: the pods run its train).
POD_SCRIPT = r"""set -e
mode=$1; k=$2; keep=$3; shift 3
if [ "$mode" = copy ] ||
   ! mount -t overlay overlay -o "lowerdir=/etc,upperdir=$k/etc-upper,workdir=$k/etc-work" /etc 2>/dev/null; then
  mkdir -p "$k/etc-copy"
  cp -a /etc/. "$k/etc-copy/"
  cp -a "$k/etc-upper/." "$k/etc-copy/"
  mount --bind "$k/etc-copy" /etc
fi
mkdir -p "$k/root-below"
mount --bind /root "$k/root-below"
mount -t tmpfs -o mode=0700 tmpfs /root
IFS=:
for d in $keep; do
  rel=${d#/root/}
  mkdir -p "/root/$rel"
  mount --bind "$k/root-below/$rel" "/root/$rel"
done
unset IFS
i=0
for target in "$@"; do
  mkdir -p "$target"
  mount --bind "$k/volume-$i" "$target"
  mount -o remount,bind,ro "$target"
  i=$((i+1))
done
"""


# A container that starts again has a fresh filesystem of its own (a new writable layer); only its volumes are
# kept.  The host's own tmpfs (/run, /dev/shm: what train writes outside /opt/ml and the volumes) start afresh.
FRESH_CONTAINER = r"""set -e
umount --lazy /run
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mkdir -m 0755 /run/sshd
umount --lazy /dev/shm
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
"""


REPLACED_OFFSET = 100  # a pod made again gets the address this far above its last (the cluster's hosts start at .11)


def _no_view(opt_ml: Path) -> None:
    for name in ("hyperparameters.json", "resourceconfig.json", "inputdataconfig.json"):
        (opt_ml / "input" / "config" / name).unlink()  # the operator gives no /opt/ml view


def kept_under_root() -> list[str]:
    """What of this machine the pods run that lives under /root (the checkout, the venvs, a pyenv python)."""
    from helpers.paths import REPO

    found = {os.path.realpath(p) for p in (REPO, sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))}
    return sorted(p for p in found if p.startswith("/root/"))


class Simulation:
    """The pods of one job on one local cluster, and the DNS records they have while they run."""

    def __init__(self, pods: Sequence[Pod], workdir: Path, etc_mode: str = ""):
        self.pods = [p for p in pods if p.scheduled]
        self.etc_mode = etc_mode  # "copy": a copy of /etc for every pod, as where /etc cannot be an overlay's lower layer
        self.workdir = workdir
        self.records_file = workdir / "kube-dns.json"
        self.records: dict[str, list[str]] = {}
        self.address: dict[str, str] = {}
        self.cluster = None
        self._lock = threading.Lock()
        self._replaced: list[str] = []  # the addresses pods had before they were made again

    def before_start(self, cluster) -> None:
        self.cluster = cluster
        self.address = {h.name: h.address for h in cluster.hosts}
        self.records[DNS_RECORD] = [self.address[DNS_HOST]]
        self._publish()
        dns = Path(__file__).with_name("kube_dns.py")
        cluster.popen(DNS_HOST, [sys.executable, str(dns), str(self.records_file), self.address[DNS_HOST], "900"])
        for pod in self.pods:
            _no_view(cluster.host(pod.name).opt_ml)
            root = k8s_dir(cluster.workdir, pod.name)
            (root / "etc-work").mkdir(parents=True)
            (root / "etc-upper").mkdir()
            (root / "etc-upper/hosts").write_text(kubelet_hosts(pod, self.address[pod.name]))
            (root / "etc-upper/resolv.conf").write_text(resolv_conf(pod, self.address[DNS_HOST]))
            targets = []
            for i, (path, volume) in enumerate(pod.volumes.items()):
                write_volume(root / f"volume-{i}", volume)
                targets.append(path)
            done = cluster.run(pod.name, ["sh", "-c", POD_SCRIPT, "pod", self.etc_mode or "overlay", str(root),
                                          ":".join(kept_under_root()), *targets], timeout=30, capture_output=True, text=True)
            assert done.returncode == 0, f"{pod.name}: {done.stdout}{done.stderr}"
        self._wait_for_dns(cluster)

    def container_ended(self, pod: str) -> None:
        """Its processes are gone (the launcher ended them); the next container of the pod starts with fresh files."""
        done = self.cluster.run(pod, ["sh", "-c", FRESH_CONTAINER], timeout=30, capture_output=True, text=True)
        assert done.returncode == 0, f"{pod}: {done.stdout}{done.stderr}"

    def replace(self, pod_name: str, job: LocalJob) -> str:
        """The pod made again under its name (its container ended already): a new address, a fresh emptyDir; the address.

        Its DNS record moves to the new address when its container starts (``on_start``).
        """
        pod = next(p for p in self.pods if p.name == pod_name)
        old = self.address[pod_name]
        new = str(ipaddress.ip_address(old) + REPLACED_OFFSET * (1 + sum(a == old for a in self._replaced)))
        self._replaced.append(old)
        moved = (f"cidr=$(ip -o -4 addr show dev {INTERFACE} | awk '{{print $4}}'); ip addr del \"$cidr\" dev {INTERFACE}"
                 f" && ip addr add {new}/${{cidr#*/}} dev {INTERFACE} && cat > /etc/hosts")
        done = self.cluster.run(pod_name, ["sh", "-c", moved], input=kubelet_hosts(pod, new), timeout=30,
                                capture_output=True, text=True)
        assert done.returncode == 0, f"{pod_name}: {done.stdout}{done.stderr}"
        opt_ml = self.cluster.host(pod_name).opt_ml
        for child in opt_ml.iterdir():  # an emptyDir is the pod's: a new pod has a new one
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        host_tree(opt_ml, job, pod_name)
        _no_view(opt_ml)
        self.address[pod_name] = new
        return new

    def _wait_for_dns(self, cluster) -> None:
        """Until the DNS host answers its own name, as a pod's resolver asks it."""
        probe = self.pods[0].name
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if cluster.run(probe, ["getent", "hosts", DNS_RECORD], timeout=15, capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError("the simulated cluster DNS did not start")

    def on_start(self, procs: Mapping[str, object]) -> None:
        """Containers started: their records appear; a watcher removes each as its container ends."""
        with self._lock:
            for pod in self.pods:
                if pod.name in procs:
                    for name in pod.records:
                        self.records.setdefault(name, []).append(self.address[pod.name])
            self._publish()
            at = {name: self.address[name] for name in procs}  # a pod made again later has another
        threading.Thread(target=self._watch, args=(dict(procs), at), daemon=True).start()

    def _watch(self, procs: Mapping[str, object], at: Mapping[str, str]) -> None:
        running = dict(procs)
        deadline = time.monotonic() + 900
        while running and time.monotonic() < deadline:
            for name, proc in list(running.items()):
                if proc.poll() is not None:  # type: ignore[attr-defined]
                    del running[name]
                    self._remove(name, at[name])
            time.sleep(0.02)

    def _remove(self, pod_name: str, address: str) -> None:
        pod = next(p for p in self.pods if p.name == pod_name)
        with self._lock:
            for name in pod.records:
                left = [a for a in self.records.get(name, []) if a != address]
                if left:
                    self.records[name] = left
                else:
                    self.records.pop(name, None)
            self._publish()

    def _publish(self) -> None:
        tmp = self.records_file.with_name(".kube-dns.json.tmp")
        tmp.write_text(json.dumps(self.records))
        os.replace(tmp, self.records_file)


def run(pods: Sequence[Pod], tmp_path: Path, hyperparameters: Mapping[str, object], *, env=None, channels=None,
        timeout_s: float = 180, on_start: Callable | None = None, start: Sequence[str] | None = None,
        kubelet: Callable[[str, int], float | None] | None = None, etc_mode: str = "",
        operator: Callable[[str, int], float | None] | None = None, before_start: Callable | None = None):
    """Run the pods' ``train`` on a local cluster as the operator would start them; every scheduled pod's result.

    ``kubelet`` (``helpers.kubelet.Kubelet``): each pod is a container that ends with its ``train`` and
    is restarted in place as its ``restartPolicy`` says; ``on_start`` hears of each restarted ``train``
    too (its record is back in DNS by then).  Without it, no container is ever restarted.
    ``operator`` (pod, exit code) -> seconds, or None: asked when the kubelet does not restart a pod's
    container; seconds: the pod is made again under its name (``Simulation.replace``) and its
    container starts that much later.  ``before_start`` (the cluster) after the pods are laid out.
    """
    workdir = tmp_path / "cluster"
    sim = Simulation(pods, workdir, etc_mode)
    hp = json.dumps(dict(hyperparameters)).encode()
    host_env = {}
    for pod in sim.pods:
        pod.volumes.setdefault(HP_MOUNT, Volume({"hyperparameters.json": (hp, 0o644)}))  # our manifests' ConfigMap
        host_env[pod.name] = {
            "KUBERNETES_SERVICE_HOST": API_SERVER, "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": f"tcp://{API_SERVER}:443",
            "HOSTNAME": pod.name, "TRAINING_TOOLKIT_TERMINATION_LOG": str(k8s_dir(workdir, pod.name) / "termination-log"),
            **pod.env}

    def started(procs):
        sim.on_start(procs)
        if on_start is not None:
            on_start(procs)

    job = LocalJob(hosts=[p.name for p in sim.pods], hyperparameters={}, channels=channels or {},
                   env=dict(env or {}), host_env=host_env, platform_secret=False, start_hosts=start,
                   outsiders=[DNS_HOST])
    def restart(pod: str, exit_code: int) -> float | None:
        delay = kubelet(pod, exit_code) if kubelet is not None else None  # first: it may wait for a node to die
        sim.container_ended(pod)
        if delay is None and operator is not None and (delay := operator(pod, exit_code)) is not None:
            sim.replace(pod, job)
        return delay

    def laid_out(cluster) -> None:
        sim.before_start(cluster)
        if before_start is not None:
            before_start(cluster)

    return run_job(job, tmp_path, timeout_s=timeout_s, before_start=laid_out, on_start=started,
                   restart=restart if kubelet is not None or operator is not None else None)


# -- what each operator gives ------------------------------------------------------------------

def go_json(value) -> str:
    """Go's json.Marshal of a map: compact, keys sorted."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def tfjob(name: str, ns: str, replicas: Mapping[str, int], port: int = 2222, container: str = "tensorflow") -> list[Pod]:
    """training-operator v1.9: TF_CONFIG only when distributed, only in the container named tensorflow."""
    types = [(kind.lower(), i) for kind, count in replicas.items() for i in range(count)]
    cluster: dict[str, list[str]] = {}
    for kind, i in types:
        cluster.setdefault(kind, []).append(f"{name}-{kind}-{i}.{ns}.svc:{port}")
    distributed = len(types) != 1
    pods = []
    for kind, i in types:
        host = f"{name}-{kind}-{i}"
        env = {"TF_CONFIG": go_json({"cluster": cluster, "task": {"type": kind, "index": i}, "environment": "cloud"})} \
            if distributed and container == "tensorflow" else {}
        pods.append(Pod(host, ns, env, records=(f"{host}.{ns}.svc.{CLUSTER_DOMAIN}",)))
    return pods


def pytorchjob(name: str, ns: str, workers: int, nproc: int | str = "auto", port: int = 23456) -> list[Pod]:
    """training-operator v1.9: every container of every pod; WORLD_SIZE = pods x nprocPerNode."""
    hosts = [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(workers))]
    per_pod = int(nproc) if str(nproc).isdigit() else 1
    shared = {"PYTHONUNBUFFERED": "1", "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port), "MASTER_ADDR": hosts[0],
              "PET_MASTER_ADDR": hosts[0], "WORLD_SIZE": str(len(hosts) * per_pod), "PET_NPROC_PER_NODE": str(nproc),
              "PET_NNODES": str(len(hosts))}
    return [Pod(h, ns, {**shared, "RANK": str(r), "PET_NODE_RANK": str(r)}, records=(f"{h}.{ns}.svc.{CLUSTER_DOMAIN}",))
            for r, h in enumerate(hosts)]


def mpi_key() -> tuple[bytes, bytes]:
    """What mpi-operator makes: an ECDSA P-521 key, private as SEC1 PEM, public as an authorized_keys line."""
    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    return private, public


def mpijob(name: str, ns: str, workers: int, slots: int, launcher_as_worker: bool = True) -> list[Pod]:
    """mpi-operator v0.8.2 (v2beta1), Open MPI: the hostfile on the launcher only; a worker gets its role alone."""
    private, public = mpi_key()
    ssh = Volume({"id_rsa": (private, 0o600), "id_rsa.pub": (public, 0o600), "authorized_keys": (public, 0o600)})
    domain = f"{name}.{ns}.svc"
    launcher, worker_names = f"{name}-launcher", [f"{name}-worker-{i}" for i in range(workers)]
    listed = ([launcher] if launcher_as_worker else []) + worker_names
    hostfile = "".join(f"{h}.{domain} slots={slots}\n" for h in listed).encode()
    discover = ("#!/bin/sh\n" + "".join(f"echo {h}.{domain}\n" for h in listed)).encode()
    launcher_env = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "OMPI_MCA_orte_set_default_slots": str(slots)}
    if not launcher_as_worker:
        launcher_env.update({"NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""})
    service = f"{name}.{ns}.svc.{CLUSTER_DOMAIN}"
    pods = [Pod(launcher, ns, launcher_env, subdomain=name, records=(f"{launcher}.{domain}.{CLUSTER_DOMAIN}", service),
                volumes={"/etc/mpi": Volume({"hostfile": (hostfile, 0o444), "discover_hosts.sh": (discover, 0o555)}),
                         "/root/.ssh": ssh})]
    for host in worker_names:
        pods.append(Pod(host, ns, {"K_MPI_JOB_ROLE": "worker"}, subdomain=name,
                        records=(f"{host}.{domain}.{CLUSTER_DOMAIN}", service), search=(f"{domain}.{CLUSTER_DOMAIN}",),
                        volumes={"/root/.ssh": ssh}))
    return pods


def jobset(name: str, ns: str, shape: Sequence[tuple[str, int, int]], attempt: int = 0,
           subdomain: str | None = None) -> list[Pod]:
    """JobSet: JOB_COMPLETION_INDEX from the indexed Job; the rest only as our manifest maps the labels in."""
    sub = subdomain or name
    raw_shape = ",".join(f"{r}:{jobs}:{pods}" for r, jobs, pods in shape)
    found = []
    for rjob, jobs, pods in shape:
        for j in range(jobs):
            for p in range(pods):
                host = f"{name}-{rjob}-{j}-{p}"
                env = {"JOB_COMPLETION_INDEX": str(p),  # the Job's
                       "JOBSET_NAME": name, "REPLICATED_JOB_NAME": rjob, "JOB_INDEX": str(j),  # the manifest's
                       "JOBSET_RESTART_ATTEMPT": str(attempt), "TRAINING_TOOLKIT_JOBSET_SHAPE": raw_shape}
                found.append(Pod(host, ns, env, subdomain=sub, records=(f"{host}.{sub}.{ns}.svc.{CLUSTER_DOMAIN}",)))
    return found


def indexed_job(name: str, ns: str, completions: int, subdomain: str | None) -> list[Pod]:
    """A plain indexed Job: JOB_COMPLETION_INDEX and the hostname; peers resolve only with a subdomain."""
    pods = []
    for i in range(completions):
        host = f"{name}-{i}"
        records = (f"{host}.{subdomain}.{ns}.svc.{CLUSTER_DOMAIN}",) if subdomain else ()
        pods.append(Pod(host, ns, {"JOB_COMPLETION_INDEX": str(i), "TRAINING_TOOLKIT_COMPLETIONS": str(completions)},
                        subdomain=subdomain, records=records))
    return pods
