"""The kubelet's restarts of a pod's container, and the operator's backoffLimit, for the simulated pods.

What a real cluster does when a pod's container ends (``helpers/kubernetes.py`` makes the pods):

- ``restartPolicy`` (pod spec): ``Never`` leaves it ended; ``OnFailure`` (the default of
  PyTorchJob, TFJob and JobSet pods) starts it again when it ended with a non-zero code;
  ``Always`` whatever the code.  The container starts again **in the same pod**: same
  hostname, same IP, the same emptyDir volumes (``/opt/ml`` in our manifests) as the run
  before left them; its processes all ended with it (the runtime ends the container).
- the back-off (kubelet ``kuberuntime_manager.go`` ``doBackOff``, ``flowcontrol.Backoff``):
  the first restart is not delayed (no back-off entry yet), then 10 s, doubling, at most
  300 s (the entry is forgotten after 10 minutes without a failure: not modelled, the tests
  are shorter); and the kubelet notices an ended container only at its next relist of the
  runtime (PLEG, every 1 s): ``SYNC_S`` is added to every restart, never less.
- the operator's ``runPolicy.backoffLimit`` (training-operator ``pkg/controller.v1/common/job.go``
  ``pastBackoffLimit``, read in the source for this work): the ``restartCount`` of every
  container of the job's running pods counts together, and the job fails once the sum is
  ``>= backoffLimit`` (``> 0`` for a limit of 0): modelled as the restart that would reach
  it never happening (what the operator then does with the pods, by ``cleanPodPolicy``, is
  not modelled).

The toolkit sees none of this but what a pod sees: its container's ``train`` starting again.
The back-off figures are the kubelet's as Kubernetes' documentation of pod restarts states
them (docs/resilience.md, "Kubernetes": at once, then 10 s doubling to 300 s); they were not re-read in the kubelet's source during this work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence

INITIAL_BACK_OFF_S = 10.0
MAX_BACK_OFF_S = 300.0
SYNC_S = 1.0  # PLEG relist period: an ended container is seen at most this late


def back_off(restarts_so_far: int) -> float:
    """Seconds the kubelet waits before restarting a container that has been restarted ``restarts_so_far`` times."""
    if restarts_so_far <= 0:
        return 0.0
    return min(INITIAL_BACK_OFF_S * 2 ** (restarts_so_far - 1), MAX_BACK_OFF_S)


def restarts_again(policy: str, exit_code: int) -> bool:
    """Does ``restartPolicy`` start a container that ended with ``exit_code`` (negative: killed by a signal) again?"""
    if policy not in ("Never", "OnFailure", "Always"):
        raise ValueError(f"no restartPolicy {policy!r}")
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def retryable(exit_code: int) -> bool:
    """training-operator's ``restartPolicy: ExitCode`` (``IsRetryableExitCode``): is a pod that ended with ``exit_code``
    made again (negative: killed by a signal, as a dead node's pod, which has no recorded exit and reads as retryable)?
    A code from 1 to 127 fails the job instead (``job_condition``)."""
    return exit_code < 0 or exit_code >= 128


def job_condition(ended: Sequence[tuple[str, int]], master: str) -> str:
    """A PyTorchJob's condition under ``restartPolicy: ExitCode``, from its pods' ends in order (pod, exit code):
    Failed once any pod ended with a code from 1 to 127 (and for good: a Failed job never changes), Succeeded once its
    Master pod ended with 0, else Running (``pytorchjob_controller.go`` ``UpdateJobStatus``, as the reference reads it)."""
    for pod, code in ended:
        if 0 < code < 128:
            return "Failed"
        if pod == master and code == 0:
            return "Succeeded"
    return "Running"


def within_backoff_limit(limit: int | None, job_restarts: int) -> bool:
    """May the job's containers be restarted once more, ``job_restarts`` restarts made (the operator's rule)?"""
    if limit is None:
        return True
    after = job_restarts + 1  # the restart would make the count this; the operator fails the job at >= limit (> 0)
    return after < limit if limit > 0 else after <= 0


class Kubelet:
    """The restarts of the pods of one job: ``run_local``'s ``restart`` (host, exit code) -> delay or None.

    ``gone``: pods whose node was lost (their container never starts again, whatever the policy).
    """

    def __init__(self, policy: str = "OnFailure", backoff_limit: int | None = None, gone: Collection[str] = ()):
        restarts_again(policy, 0)  # a bad policy fails here, not in the run loop
        self.policy = policy
        self.backoff_limit = backoff_limit
        self.gone = set(gone)
        self.restarts: dict[str, int] = {}  # by pod: its container's restartCount
        self.ended: list[tuple[str, int]] = []  # every container end, in order: (pod, exit code)
        self.ended_at: list[float] = []  # when each was seen (time.monotonic())
        self._lock = threading.Lock()

    def __call__(self, pod: str, exit_code: int) -> float | None:
        with self._lock:
            self.ended.append((pod, exit_code))
            self.ended_at.append(time.monotonic())
            if pod in self.gone or not restarts_again(self.policy, exit_code):
                return None
            if not within_backoff_limit(self.backoff_limit, sum(self.restarts.values())):
                return None
            count = self.restarts.get(pod, 0)
            self.restarts[pod] = count + 1
            return back_off(count) + SYNC_S
