"""What every Kubernetes pod has, whichever operator started it: the shared half of the operators' platforms.

The kubelet gives every container ``KUBERNETES_SERVICE_HOST`` and writes its ``/etc/hosts``:
``<podIP> <hostname>.<subdomain>.<ns>.svc.<clusterDomain> <hostname>`` when the pod has a
subdomain (MPIJob, JobSet, an indexed Job with one), else ``<podIP> <hostname>``.  Other pods'
names come only from cluster DNS, whose records appear as pods start and vanish as they end.
An operator's platform (``tfjob``, ``pytorchjob``, ``mpijob``, ``jobset``, ``job``, ``pod``) says
which hosts the job has and which this pod is (``PodPlatform.hosts_of``); this module makes the
rest of the view (hyperparameters from the mounted ConfigMap and/or the variable, channels from
the volumes under ``input/data``, a grace period that fits the default
``terminationGracePeriodSeconds``), waits for the names, and writes the termination log.

A container restarted inside its pod finds its ``/opt/ml`` (an emptyDir) as the last run left it:
``.training-toolkit-runs`` counts the runs, the count is named in the termination message, and
the restarted container joins like any host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
import json
from typing import Any, NamedTuple

from training_toolkit.core import names
from training_toolkit.core.errors import ClusterError
from training_toolkit.job.spec import parse_json_object
from training_toolkit.core.log import PREFIX, log
from training_toolkit.platforms.opt_ml import FILE_CHANNEL
from training_toolkit.platforms.view import IN_A_POD, Facts, JobView
from training_toolkit.record.schema import said_summary
from training_toolkit.config.settings import Overrides, Settings

INTERFACE = "eth0"
GRACE_S = 25.0  # terminationGracePeriodSeconds defaults to 30: 5 s left for the toolkit's own ending
# A dead node's pods: NotReady after about 40 s, evicted after the default 300 s toleration, then made again (a
# replica's missing pod): the lead keeps the verdict that long and a little more for the platform's first host, lost
# and made again after the job's work is done, so that it exits with the job's verdict (a PyTorchJob succeeds on its
# Master's exit)
VERDICT_WAIT_S = 420.0
TERMINATION_LIMIT = 4096  # bytes of the termination message the kubelet keeps
RUNS_FILE = ".training-toolkit-runs"  # in /opt/ml: one line per run of train in this pod
HOSTS_FILE = "/etc/hosts"


class PodName(NamedTuple):
    """This pod's names as the kubelet wrote them in /etc/hosts."""

    hostname: str
    subdomain: str | None  # None: the pod has no subdomain (TFJob, PyTorchJob, a plain pod)
    namespace: str | None
    cluster_domain: str | None


def in_a_pod(facts: Facts) -> bool:
    """A pod whose /opt/ml no platform laid out before: a resourceconfig.json not ours means SageMaker's view."""
    if not facts.environ.get(IN_A_POD):
        return False
    ours = facts.read(str(facts.paths.base / RUNS_FILE)) is not None  # written before this container restarted
    return ours or facts.read(str(facts.paths.resource_config_file)) is None


def pod_name(facts: Facts) -> PodName:
    """The pod's FQDN from the kubelet's /etc/hosts: ``<hostname>.<subdomain>.<ns>.svc.<clusterDomain>``."""
    text = facts.read(HOSTS_FILE) or ""
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        for name in fields[1:]:
            head, _, rest = name.partition(".")
            parts = rest.split(".")
            if head == facts.hostname and len(parts) >= 3 and parts[2] == "svc":
                return PodName(facts.hostname, parts[0], parts[1], ".".join(parts[3:]) or None)
    return PodName(facts.hostname, None, None, None)


def previous_runs(facts: Facts) -> int:
    return len((facts.read(str(facts.paths.base / RUNS_FILE)) or "").splitlines())


def hyperparameters(facts: Facts, defaults: Mapping[str, Any]) -> dict[str, str]:
    """hyperparameters.json: the mounted file, the variable's keys over it, then the operator's defaults.

    Neither given: the job's own ``hyperparameters.json`` (a volume mounted into ``/opt/ml``), if any.
    The operator's defaults (a distribution switch and its ports) apply only when the job switched no
    distribution on itself.  Values are stored as SageMaker stores them: JSON text.
    """
    config = facts.settings
    text = facts.read(config.hyperparameters_file)
    mounted = parse_json_object(text, config.hyperparameters_file) if text is not None else None
    inline = (parse_json_object(config.hyperparameters, "environment variable TRAINING_TOOLKIT_HYPERPARAMETERS")
              if config.hyperparameters else None)
    if mounted is None and inline is None:
        own = facts.read(str(facts.paths.hyperparameters_file))
        mounted = parse_json_object(own, str(facts.paths.hyperparameters_file)) if own is not None else None
    merged: dict[str, Any] = {**(mounted or {}), **(inline or {})}
    if not any(key in merged for key in names.SWITCHES):
        merged = {**defaults, **merged}
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in merged.items()}


def channels(facts: Facts) -> dict[str, dict[str, str]]:
    """inputdataconfig.json: the job's own (if mounted), plus every volume mounted under ``input/data``."""
    own = facts.read(str(facts.paths.input_data_config_file))
    found = dict(parse_json_object(own, str(facts.paths.input_data_config_file))) if own is not None else {}
    for name in facts.listdir(str(facts.paths.data_dir)):
        found.setdefault(name, dict(FILE_CHANNEL))
    return found


def termination_message(exit_code: int, reason: str | None, restarts: int, summary: str | None = None) -> str:
    """The verdict's line first (what ``kubectl get pods`` users read), then the job's summary line (``record``), cut
    to what the kubelet keeps."""
    head = f"container restart {restarts}: " if restarts else ""
    text = f"{head}{reason}" if reason else f"{head}training completed (exit code {exit_code})"
    if summary:
        text = f"{text}\n{PREFIX}{summary}"
    return text.encode("utf-8")[:TERMINATION_LIMIT - 1].decode("utf-8", "ignore")


class PodPlatform:
    """An operator's platform: ``hosts_of`` is its own; the rest is what every pod shares."""

    name = "pod"

    def detected(self, facts: Facts) -> bool:
        return in_a_pod(facts)

    def hosts_of(self, facts: Facts) -> tuple[tuple[str, ...], str, Mapping[str, Any], int]:
        """(hosts in rank order, this pod's host, the operator's default hyperparameters, restart attempt)."""
        return (facts.hostname,), facts.hostname, {}, 0

    def view(self, facts: Facts) -> JobView:
        hosts, current, defaults, attempt = self.hosts_of(facts)
        restarts = previous_runs(facts)
        notes = [f"{self.name}: host {current} of {', '.join(hosts)}"]
        if restarts:
            notes.insert(0, f"{self.name}: this container restarted ({restarts} earlier run(s) in this pod); "
                            "joining the job again")
        return JobView(self.name, hosts, current, INTERFACE, hyperparameters(facts, defaults), channels(facts),
                       self.overrides(facts), attempt, container_restarts=restarts, notes=tuple(notes))

    def overrides(self, facts: Facts) -> Overrides:
        return Overrides(grace_s=GRACE_S, verdict_wait_s=VERDICT_WAIT_S, rejoin_wait_s=0.0)

    def wait(self, view: JobView, settings: Settings) -> None:
        _record_run(settings.base_dir, view.restart_attempt)
        wait_for_names(view.hosts, settings.dns_timeout_s)

    def report_end(self, facts: Facts, view: JobView | None, exit_code: int, reason: str | None) -> None:
        path = facts.settings.termination_log
        try:
            with open(path, "w", encoding="utf-8") as f:
                restarts = view.container_restarts if view is not None else previous_runs(facts)  # not yet recorded
                summary = None if view is None else said_summary(facts.paths.output_data_dir, view.current_host)
                f.write(termination_message(exit_code, reason, restarts, summary) + "\n")
        except OSError as exc:
            log(f"warning: cannot write the termination log {path}: {exc.strerror or exc}")


def wait_for_names(hosts: tuple[str, ...], timeout_s: float, poll_s: float = 0.5,
                   resolve: Callable[[str], Any] | None = None) -> None:
    """Until every host's name resolves; a ClusterError naming the ones that never did, or one that ended.

    A pod's DNS record appears when it starts and vanishes when it ends: a name that resolved and then
    stopped resolving is a peer that failed (or was deleted), and the wait ends at once, naming it,
    instead of waiting out the deadline for a pod that is gone.  SIGTERM ends the wait too.
    """
    import signal
    import threading

    if resolve is None:
        from training_toolkit.cluster.netaddr import resolve  # in a pod only: off the SageMaker launch path
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    missing = [h for h in hosts if not resolve(h)]
    seen.update(h for h in hosts if h not in missing)
    if not missing:
        return
    log(f"waiting up to {timeout_s:g} s for pod name(s) to resolve: {', '.join(missing)}")

    def stop(signum, _frame):
        raise ClusterError(f"stopped by {signal.Signals(signum).name} while waiting for pod name(s) "
                           f"{', '.join(missing)} to resolve")

    previous = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    try:
        while missing and time.monotonic() < deadline:
            time.sleep(poll_s)
            status = {h: bool(resolve(h)) for h in hosts}
            gone = sorted(h for h in seen if not status[h])
            if gone:
                raise ClusterError(f"pod(s) {', '.join(gone)} ended while this pod waited for its peers "
                                   "(their DNS record vanished): see their termination message")
            seen.update(h for h, ok in status.items() if ok)
            missing = [h for h in hosts if not status[h]]
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if missing:
        raise ClusterError(f"pod name(s) {', '.join(missing)} did not resolve within {timeout_s:g} s "
                           "(pod not scheduled or not running, or its headless service missing)")


def _record_run(base_dir: str, attempt: int) -> None:
    path = f"{base_dir.rstrip('/')}/{RUNS_FILE}"
    try:
        os.makedirs(base_dir, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f} attempt={attempt}\n")
    except OSError as exc:
        log(f"warning: cannot record this run in {path}: {exc.strerror or exc}")
