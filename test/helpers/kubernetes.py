"""Kubernetes operators simulated on a local namespace cluster: each pod gets what its operator would give.

Per pod: its hostname (the namespace host's name, as the pod's), the operator's variables
(plus the kubelet's ``KUBERNETES_SERVICE_HOST``), its mounted files with the operator's modes,
and DNS names through the cluster's shared hosts file (FQDNs such as
``job-worker-0.job.ns.svc`` as aliases of the host's address).  Mounted files live in the
host's own tree, at ``<workdir>/<pod>/k8s/...``, and the variables that name a mount point
(``OMPI_MCA_orte_default_hostfile``, the ssh mount, the ConfigMap, the termination log) point
there: same contents and modes, another path.  Nothing here is a real cluster.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from training_toolkit.local.launcher import LocalJob

API_SERVER = "192.0.2.1"  # what the kubelet puts in KUBERNETES_SERVICE_HOST; never contacted here


@dataclass
class Pod:
    name: str  # the pod's hostname
    aliases: tuple[str, ...] = ()  # other DNS names of the pod (FQDNs)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path under k8s/ -> (content, mode)
    resolvable: bool = True  # False: its names are never in DNS (a pod that never got scheduled)


def mount_root(workdir: Path, pod: str) -> Path:
    return workdir / pod / "k8s"


def common_env(workdir: Path, pod: str) -> dict[str, str]:
    root = mount_root(workdir, pod)
    return {"KUBERNETES_SERVICE_HOST": API_SERVER, "KUBERNETES_SERVICE_PORT": "443",
            "TRAINING_TOOLKIT_HYPERPARAMETERS_FILE": str(root / "etc/training-toolkit/hyperparameters.json"),
            "TRAINING_TOOLKIT_TERMINATION_LOG": str(root / "dev/termination-log")}


def job(pods: Sequence[Pod], workdir: Path, hyperparameters: Mapping[str, object], channels=None,
        env: Mapping[str, str] | None = None, start: Sequence[str] | None = None):
    """A LocalJob of the pods that exist, and the before_start hook that mounts their files and names."""
    running = [p for p in pods if p.resolvable]
    hp = json.dumps(dict(hyperparameters)).encode()
    for pod in running:
        pod.files.setdefault("etc/training-toolkit/hyperparameters.json", (hp, 0o644))  # a ConfigMap volume
        pod.env = {**common_env(workdir, pod.name), **pod.env}

    def before_start(cluster) -> None:
        for pod in running:
            opt_ml = cluster.host(pod.name).opt_ml
            for name in ("hyperparameters.json", "resourceconfig.json", "inputdataconfig.json"):
                (opt_ml / "input" / "config" / name).unlink()  # the operator gives no /opt/ml view
            for rel, (data, mode) in pod.files.items():
                path = mount_root(cluster.workdir, pod.name) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                os.chmod(path, mode)
            (mount_root(cluster.workdir, pod.name) / "dev").mkdir(parents=True, exist_ok=True)
        address = {h.name: h.address for h in cluster.hosts}
        with open(cluster.hosts_file, "a") as f:  # the same inode every host has bind-mounted as /etc/hosts
            for pod in running:
                if pod.aliases:
                    f.write(f"{address[pod.name]}\t{' '.join(pod.aliases)}\n")

    local = LocalJob(hosts=[p.name for p in running], hyperparameters={}, channels=channels or {},
                     env=dict(env or {}), host_env={p.name: p.env for p in running}, platform_secret=False,
                     start_hosts=start)
    return local, before_start


def termination_log(workdir: Path, pod: str) -> str:
    return (mount_root(workdir, pod) / "dev/termination-log").read_text()


# -- what each operator gives ------------------------------------------------------------------

def tfjob(name: str, ns: str, chief: bool, workers: int, port: int = 2222) -> list[Pod]:
    types = [("chief", 0)] * chief + [("worker", i) for i in range(workers)]
    cluster: dict[str, list[str]] = {}
    for kind, i in types:
        cluster.setdefault(kind, []).append(f"{name}-{kind}-{i}.{ns}.svc:{port}")
    return [Pod(f"{name}-{kind}-{i}", (f"{name}-{kind}-{i}.{ns}.svc",),
                {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}, "environment": "cloud"})})
            for kind, i in types]


def pytorchjob(name: str, workers: int, nproc: int, port: int = 23456) -> list[Pod]:
    names = [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(workers))]
    master = {"MASTER_ADDR": names[0], "MASTER_PORT": str(port), "WORLD_SIZE": str(len(names)),
              "PET_MASTER_ADDR": names[0], "PET_MASTER_PORT": str(port), "PET_NNODES": str(len(names)),
              "PET_NPROC_PER_NODE": str(nproc), "PYTHONUNBUFFERED": "0"}
    return [Pod(n, (), {**master, "RANK": str(r), "PET_NODE_RANK": str(r)}) for r, n in enumerate(names)]


def mpijob(name: str, ns: str, workers: int, slots: int, workdir: Path) -> list[Pod]:
    key = ec.generate_private_key(ec.SECP521R1())  # what mpi-operator makes (crypto/ecdsa, P-521)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    names = [f"{name}-launcher", *(f"{name}-worker-{i}" for i in range(workers))]
    hostfile = "".join(f"{n}.{name}.{ns}.svc slots={slots}\n" for n in names).encode()  # runLauncherAsWorker: true
    discover = ("#!/bin/sh\n" + "".join(f"echo {n}.{name}.{ns}.svc:{slots}\n" for n in names)).encode()
    pods = []
    for n in names:
        root = mount_root(workdir, n)
        env = {"K_MPI_JOB_ROLE": "launcher" if n == names[0] else "worker",
               "OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_default_hostfile": str(root / "etc/mpi/hostfile"),
               "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
               "TRAINING_TOOLKIT_SSH_KEYS": str(root / "root/.ssh")}  # sshAuthMountPath
        files = {"etc/mpi/hostfile": (hostfile, 0o444), "etc/mpi/discover_hosts.sh": (discover, 0o555),
                 "root/.ssh/id_rsa": (private, 0o644), "root/.ssh/id_rsa.pub": (public, 0o644),
                 "root/.ssh/authorized_keys": (public, 0o644)}  # a secret volume: 0644 by default
        pods.append(Pod(n, (f"{n}.{name}.{ns}.svc",), env, files))
    return pods


def jobset(name: str, rjob: str, jobs: int, pods: int, attempt: int = 0, extra_shape: str = "") -> list[Pod]:
    shape = f"{rjob}:{jobs}:{pods}" + (f",{extra_shape}" if extra_shape else "")
    found = []
    for j in range(jobs):
        for p in range(pods):
            host = f"{name}-{rjob}-{j}-{p}"
            found.append(Pod(host, (f"{host}.{name}",), {
                "JOB_COMPLETION_INDEX": str(p), "JOBSET_NAME": name, "REPLICATED_JOB_NAME": rjob, "JOB_INDEX": str(j),
                "JOBSET_RESTART_ATTEMPT": str(attempt), "TRAINING_TOOLKIT_JOBSET_SHAPE": shape}))
    return found
