"""The container engine behind ``DOCKER_HOST`` (dockerd, or podman's Docker-compatible service).

A thin shell over the ``docker`` SDK (the ``containers`` extra): connect with a
one-line error that names the socket and how to start an engine there, check an
image, find what a job left, and remove it.  Everything a job makes carries the
label ``containers.LABEL_JOB``; removal and the leftover check go by that label,
so a half-made job is cleaned up as fully as a finished one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from training_toolkit.core.errors import ClusterError, ConfigError
from training_toolkit.local.containers import LABEL_JOB, LABEL_LAUNCHER

#: The SDK's default when ``DOCKER_HOST`` is unset.
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
#: Seconds an API call may take (waits and log streams are not bounded by it).
API_TIMEOUT_S = 60


class EngineError(ClusterError):
    """No engine, an image that cannot run the job, a name taken, a container that cannot start."""


def socket_url(environ: Mapping[str, str]) -> str:
    """The engine's address: ``DOCKER_HOST`` of the launcher's environment (its caller's), else the SDK's default."""
    return environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def connect(url: str, pool_size: int = 16, timeout_s: float | None = API_TIMEOUT_S) -> Any:
    """A ``docker.DockerClient`` on the engine at ``url`` (``socket_url``), checked with a ping.

    ``timeout_s`` None: no read timeout, for log streams (podman's service sends a followed log's
    headers only with its first line, which may come minutes after the start).
    """
    try:
        import docker
    except ImportError:
        raise ConfigError("training-toolkit local", "--image",
                          "needs the docker SDK: pip install 'training-toolkit[containers]'") from None
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout_s, max_pool_size=pool_size)
        client.ping()
    except Exception as exc:  # connection refused, no such file, bad URL, not an engine
        raise EngineError(f"no container engine at {url} ({_connect_cause(exc)}): start one there (`dockerd -H {url}`, or "
                          f"`podman system service --time=0 {url}`) or point DOCKER_HOST at a running engine's socket") from None
    return client


def check_image(client: Any, image: str, url: str) -> None:
    """The image exists at the engine (whether it has ``train`` shows when a container starts)."""
    import docker.errors

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise EngineError(f"image {image} not found at {url}: build it there (docs/images.md) "
                          "or name one that exists") from None
    except docker.errors.APIError as exc:
        raise EngineError(f"image {image}: {cause(exc)}") from None


def containers(client: Any, label: str | None = None) -> list[dict[str, Any]]:
    """Every container (with ``label``, ``NAME`` or ``NAME=VALUE``), as the engine lists them: one call.

    ``Name`` (without the leading slash), ``Id`` and ``Labels`` of each.  The SDK's
    ``containers.list`` inspects each container after listing, and podman answers 500, not 404,
    for one another job removed in between: a listing must not fail because others come and go.
    """
    found = client.api.containers(all=True, filters={"label": label} if label else None)
    return [{"Name": (c.get("Names") or ["?"])[0].lstrip("/"), "Id": c["Id"], "Labels": c.get("Labels") or {}}
            for c in found]


def networks(client: Any, label: str) -> list[dict[str, Any]]:
    """Every network with ``label`` (``NAME`` or ``NAME=VALUE``): ``Name``, ``Id`` and ``Labels`` of each."""
    return [{"Name": n["Name"], "Id": n["Id"], "Labels": n.get("Labels") or {}}
            for n in client.api.networks(filters={"label": label})]


def taken_names(client: Any, names: Iterable[str]) -> list[str]:
    """Which of ``names`` existing containers already have."""
    wanted = set(names)
    return sorted(c["Name"] for c in containers(client) if c["Name"] in wanted)


def leftovers(client: Any, job_id: str) -> list[str]:
    """What the engine still holds of the job: containers and networks with its label."""
    selector = f"{LABEL_JOB}={job_id}"
    return ([f"container {c['Name']}" for c in containers(client, selector)]
            + [f"network {n['Name']}" for n in networks(client, selector)])


def abandoned_jobs(client: Any, alive: Callable[[str], bool | None]) -> dict[str, str]:
    """Jobs whose launcher is known to have died (``alive(launcher)`` False), with that launcher: job id -> launcher.

    A job of a launcher on another machine (``alive`` None) or without the label is never listed.
    """
    found = {}
    for thing in containers(client, LABEL_LAUNCHER) + networks(client, LABEL_LAUNCHER):
        job, launcher = thing["Labels"].get(LABEL_JOB), thing["Labels"].get(LABEL_LAUNCHER)
        if job and launcher and job not in found and alive(launcher) is False:
            found[job] = launcher
    return found


def remove_job(client: Any, job_id: str) -> list[str]:
    """Remove the job's containers (killing any still running) and then its networks; never raises.

    Returns what could not be removed (empty when everything went).
    """
    selector = f"{LABEL_JOB}={job_id}"
    problems = []
    try:
        for container in containers(client, selector):
            try:
                client.api.remove_container(container["Id"], force=True, v=True)
            except Exception as exc:
                if not _gone(exc):
                    problems.append(f"container {container['Name']}: {cause(exc)}")
        for network in networks(client, selector):
            try:
                client.api.remove_network(network["Id"])
            except Exception as exc:
                if not _gone(exc):
                    problems.append(f"network {network['Name']}: {cause(exc)}")
    except Exception as exc:
        problems.append(f"listing the job's containers: {cause(exc)}")
    return problems


def start_error(name: str, image: str, exc: Exception) -> EngineError:
    """A one-line error for a container that would not start; an image without ``train`` is named as such."""
    why = cause(exc)
    lowered = why.lower()
    if "train" in lowered and ("not found" in lowered or "no such file" in lowered):
        return EngineError(f"image {image} has no `train` on its PATH (container {name} could not start: {why})")
    return EngineError(f"container {name} could not start: {why}")


def _connect_cause(exc: Exception) -> str:
    text = str(exc)
    for marker, short in (("FileNotFoundError", "no such socket"), ("ConnectionRefused", "connection refused"),
                          ("PermissionError", "permission denied")):
        if marker in text:
            return short
    return cause(exc)


def _gone(exc: Exception) -> bool:
    import docker.errors

    return isinstance(exc, docker.errors.NotFound) or "no such" in str(exc).lower()


def cause(exc: Exception) -> str:
    """One line: the engine's own explanation when there is one."""
    explanation = getattr(exc, "explanation", None)
    text = explanation.decode(errors="replace") if isinstance(explanation, bytes) else str(explanation or exc)
    return " ".join(text.split()) or type(exc).__name__
