"""Kubernetes: find the operator, build the job's ``/opt/ml`` view from its facts, end the Kubernetes way.

``train`` calls ``adapter_for`` first thing.  On SageMaker (or wherever ``/opt/ml`` is already
complete) it is None and nothing changes.  In a pod (``KUBERNETES_SERVICE_HOST`` is set and
there is no ``resourceconfig.json``), or when ``TRAINING_TOOLKIT_PLATFORM`` names an operator,
the adapter:

- reads the operator's facts through one pure function per operator (``tfjob``,
  ``pytorchjob``, ``mpijob``, ``jobset``) into a ``PodView``: hosts in rank order, this pod's
  host, framework defaults;
- waits, bounded, for every host's name to resolve (pod DNS records appear only once a pod
  runs), naming the pods that never do;
- writes ``input/config/{resourceconfig,hyperparameters,inputdataconfig}.json``
  (hyperparameters from a mounted file and/or a variable, channels from the volumes mounted
  under ``input/data``) and makes ``checkpoints``;
- adapts the environment: a grace period that fits ``terminationGracePeriodSeconds``, and under
  MPIJob the mounted keys in the toolkit's key format plus a channel secret derived from them;
- at the end writes the verdict's cause to the termination log, which ``kubectl describe pod``
  and the Job's status show.

A container restarted inside its pod finds its ``/opt/ml`` (an emptyDir) as the last run left
it: the run is counted, logged and named in the termination message; it then joins like any
host, so it rejoins a job that restarts with it, or fails within the join deadline, naming
the hosts it could not reach.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from training_toolkit import names, settings
from training_toolkit.cluster import netaddr
from training_toolkit.errors import ClusterError, ConfigError
from training_toolkit.log import log
from training_toolkit.paths import Paths
from training_toolkit.platforms import jobset, mpijob, pytorchjob, tfjob
from training_toolkit.platforms.view import AUTO, JOBSET, MPIJOB, POD, PYTORCHJOB, SAGEMAKER, TFJOB, PodView

IN_A_POD = "KUBERNETES_SERVICE_HOST"  # the kubelet gives it to every container
INTERFACE = "eth0"
GRACE_S = "25"  # terminationGracePeriodSeconds defaults to 30: 5 s left for the toolkit's own ending
TERMINATION_LIMIT = 4096  # bytes of the termination message the kubelet keeps
RUNS_FILE = ".training-toolkit-runs"  # in /opt/ml: one line per run of train in this pod


def detect(environ: Mapping[str, str], paths: Paths, chosen: str = AUTO) -> str:
    """Which platform this is: the setting if it names one, else the operator whose facts are present."""
    if chosen != AUTO:
        return chosen
    ours = (paths.base / RUNS_FILE).exists()  # a view this adapter wrote before this container restarted
    if not environ.get(IN_A_POD) or (paths.resource_config_file.exists() and not ours):
        return SAGEMAKER
    if environ.get(mpijob.ROLE):
        return MPIJOB
    if environ.get(tfjob.VARIABLE):
        return TFJOB
    if environ.get("PET_NNODES") or (environ.get("MASTER_ADDR") and environ.get("WORLD_SIZE") and environ.get("RANK")):
        return PYTORCHJOB
    if environ.get(jobset.JOBSET_NAME) or environ.get(jobset.INDEX):
        return JOBSET
    return POD


def pod_view(operator: str, environ: Mapping[str, str], hostname: str,
             read: Callable[[str], str | None]) -> PodView:
    """The operator's facts as a ``PodView``; ``read`` returns a mounted file's text or None.  Pure given ``read``."""
    if operator == TFJOB:
        return tfjob.view(environ)
    if operator == PYTORCHJOB:
        return pytorchjob.view(environ)
    if operator == MPIJOB:
        return mpijob.view(environ, read(environ.get(mpijob.HOSTFILE_VARIABLE) or mpijob.HOSTFILE), hostname)
    if operator == JOBSET:
        return jobset.view(environ)
    return PodView(POD, (hostname,), hostname)


def hyperparameters(mounted: Mapping[str, Any] | None, from_variable: Mapping[str, Any] | None,
                    defaults: Mapping[str, Any]) -> dict[str, str]:
    """hyperparameters.json: the mounted file, the variable's keys over it, then the operator's defaults.

    The operator's defaults (a distribution switch and its ports) apply only when the job
    switched no distribution on itself.  Values are stored as SageMaker stores them: JSON text.
    """
    merged: dict[str, Any] = {**(mounted or {}), **(from_variable or {})}
    if not any(key in merged for key in names.SWITCHES):
        merged = {**defaults, **merged}
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in merged.items()}


def resource_config(view: PodView) -> dict[str, Any]:
    return {"current_host": view.current_host, "hosts": list(view.hosts), "network_interface_name": INTERFACE}


def termination_message(exit_code: int, reason: str | None, restarts: int) -> str:
    """One line first (what ``kubectl get pods`` users read), cut to what the kubelet keeps."""
    head = f"container restart {restarts}: " if restarts else ""
    text = f"{head}{reason}" if reason else f"{head}training completed (exit code {exit_code})"
    data = text.encode("utf-8")[:TERMINATION_LIMIT]
    return data.decode("utf-8", "ignore")


class KubernetesAdapter:
    def __init__(self, operator: str, paths: Paths):
        self.operator = operator
        self.paths = paths
        self.previous_runs = _count_runs(paths)
        self.view: PodView | None = None
        self._termination_log = "/dev/termination-log"
        self._keys_dir: Path | None = None

    def prepare(self, environ: Mapping[str, str]) -> dict[str, str]:
        """Build the view and return the environment ``train`` goes on with."""
        env = dict(environ)
        self._termination_log = settings.value_of("termination_log", env)
        hostname = socket.gethostname()
        view = pod_view(self.operator, env, hostname, _read_text)
        self.view = view
        _record_run(self.paths, view.restart_attempt)
        if self.previous_runs:
            log(f"{self.operator}: this container restarted ({self.previous_runs} earlier run(s) in this pod); "
                "joining the job again")
        log(f"{self.operator}: host {view.current_host} of {', '.join(view.hosts)}")
        mounted = _read_json_object(settings.value_of("hyperparameters_file", env), required=False)
        inline = settings.value_of("hyperparameters", env)
        from_variable = _parse_json_object(inline, "environment variable TRAINING_TOOLKIT_HYPERPARAMETERS") if inline else None
        if mounted is None and from_variable is None:
            mounted = _read_json_object(str(self.paths.hyperparameters_file), required=False)
        env.setdefault(settings.variable("grace_s").name, GRACE_S)
        if view.operator == MPIJOB:
            env.update(self._mpi_keys(env))
        wait_for_names(view.hosts, settings.value_of("dns_timeout_s", env))
        self._write_view(view, hyperparameters(mounted, from_variable, view.framework_params))
        return env

    def _write_view(self, view: PodView, hps: Mapping[str, str]) -> None:
        config = self.paths.input_config_dir
        config.mkdir(parents=True, exist_ok=True)
        channels = _read_json_object(str(self.paths.input_data_config_file), required=False) or {}
        if self.paths.data_dir.is_dir():
            for entry in sorted(self.paths.data_dir.iterdir()):
                if entry.is_dir():
                    channels.setdefault(entry.name, {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                                                     "RecordWrapperType": "None"})
        _write_json(self.paths.resource_config_file, resource_config(view))
        _write_json(self.paths.hyperparameters_file, hps)
        _write_json(self.paths.input_data_config_file, channels)
        for sub in (self.paths.model_dir, self.paths.output_data_dir, self.paths.base / "checkpoints"):
            sub.mkdir(parents=True, exist_ok=True)

    def _mpi_keys(self, env: Mapping[str, str]) -> dict[str, str]:
        """mpi-operator's secret in the toolkit's key format, with a host key made here; a channel secret from it."""
        from training_toolkit.cluster import ssh

        source = Path(env.get(settings.variable("ssh_keys").name) or mpijob.SSH_DIR)
        try:
            private = (source / mpijob.PRIVATE).read_bytes()
            public = (source / mpijob.PUBLIC).read_text()
        except OSError as exc:
            raise ConfigError(str(source), None, f"mpi-operator's ssh secret is not mounted here: {exc.strerror or exc}") from None
        parent = Path("/run") if os.access("/run", os.W_OK) else None
        self._keys_dir = Path(tempfile.mkdtemp(prefix="training-toolkit-mpijob-keys-", dir=parent))
        files = mpijob.key_files(private, public, ssh.generate_keypair(f"training-toolkit-host@{socket.gethostname()}"))
        for name, data in files.items():
            fd = os.open(self._keys_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        added = {settings.variable("ssh_keys").name: str(self._keys_dir)}
        if not env.get(settings.JOB_SECRET):
            added[settings.JOB_SECRET] = mpijob.job_secret(private)
        return added

    def finish(self, exit_code: int, reason: str | None) -> None:
        if self._keys_dir is not None:
            import shutil

            shutil.rmtree(self._keys_dir, ignore_errors=True)
        message = termination_message(exit_code, reason, self.previous_runs)
        try:
            with open(self._termination_log, "w", encoding="utf-8") as f:
                f.write(message + "\n")
        except OSError as exc:
            log(f"warning: cannot write the termination log {self._termination_log}: {exc.strerror or exc}")


def adapter_for(paths: Paths, environ: Mapping[str, str], platform: str | None = None) -> KubernetesAdapter | None:
    """The adapter for this pod, or None off Kubernetes.  Never raises: a bad setting fails in ``prepare``."""
    try:
        chosen = settings.value_of("platform", environ, platform)
    except ConfigError:
        chosen = POD  # the adapter's prepare reports it, with a termination message
    operator = detect(environ, paths, chosen)
    return None if operator == SAGEMAKER else KubernetesAdapter(operator, paths)


def wait_for_names(hosts: tuple[str, ...], timeout_s: float, poll_s: float = 0.5) -> None:
    """Until every host's name resolves; a ClusterError naming the ones that never did.  SIGTERM ends the wait."""
    deadline = time.monotonic() + timeout_s
    missing = [h for h in hosts if not netaddr.resolve(h)]
    if not missing:
        return
    log(f"waiting up to {timeout_s:g} s for pod name(s) to resolve: {', '.join(missing)}")

    def stop(signum, _frame):
        raise ClusterError(f"stopped by {signal.Signals(signum).name} while waiting for pod name(s) "
                           f"{', '.join(missing)} to resolve")

    previous = signal.signal(signal.SIGTERM, stop) if _main_thread() else None
    try:
        while missing and time.monotonic() < deadline:
            time.sleep(poll_s)
            missing = [h for h in missing if not netaddr.resolve(h)]
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if missing:
        raise ClusterError(f"pod name(s) {', '.join(missing)} did not resolve within {timeout_s:g} s "
                           "(pod not scheduled or not running, or its headless service missing)")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _count_runs(paths: Paths) -> int:
    try:
        return len((paths.base / RUNS_FILE).read_text().splitlines())
    except OSError:
        return 0


def _record_run(paths: Paths, attempt: int) -> None:
    try:
        paths.base.mkdir(parents=True, exist_ok=True)
        with open(paths.base / RUNS_FILE, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f} attempt={attempt}\n")
    except OSError as exc:
        log(f"warning: cannot record this run in {paths.base / RUNS_FILE}: {exc.strerror or exc}")


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, None, f"cannot be read: {exc}") from None


def _parse_json_object(text: str, source: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(source, None, f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(source, None, f"expected a JSON object, got {type(value).__name__}")
    return value


def _read_json_object(path: str, required: bool) -> dict[str, Any] | None:
    text = _read_text(path)
    if text is None:
        if required:
            raise ConfigError(path, None, "file is missing")
        return None
    return _parse_json_object(text, path)


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)
