"""Pure builders of TF_CONFIG for parameter servers and MultiWorkerMirroredStrategy.

TF2's ``ParameterServerStrategy`` wants a ``chief``; estimator-era scripts (and
the reference) use ``master``.  Both are built here, tested against exact values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from training_toolkit.core.names import TF_MWMS_PORT, TF_PS_PORT, TF_WORKER_PORT

CHIEF = "chief"
MASTER = "master"  # the chief's estimator-era name in TF_CONFIG (sagemaker_parameter_server_naming)


@dataclass(frozen=True)
class PsLayout:
    """Who runs what in a parameter-server job."""

    hosts: tuple[str, ...]
    naming: str = CHIEF  # "chief" (TF2) or "master" (estimator era, the reference)
    num_ps: int | None = None  # parameter servers on the first N hosts; None: one on every host
    worker_port: int = TF_WORKER_PORT
    ps_port: int = TF_PS_PORT

    @property
    def ps_hosts(self) -> tuple[str, ...]:
        return self.hosts if self.num_ps is None else self.hosts[: self.num_ps]

    def cluster(self) -> dict[str, list[str]]:
        return {
            self.naming: [f"{self.hosts[0]}:{self.worker_port}"],
            "worker": [f"{h}:{self.worker_port}" for h in self.hosts[1:]],
            "ps": [f"{h}:{self.ps_port}" for h in self.ps_hosts],
        }

    def script_config(self, host: str) -> dict[str, Any]:
        """TF_CONFIG for the user's script on ``host``: the chief on the lead, workers elsewhere."""
        index = self.hosts.index(host)
        task = {"type": self.naming, "index": 0} if index == 0 else {"type": "worker", "index": index - 1}
        return _config(self.cluster(), task, legacy=self.naming == MASTER)

    def ps_config(self, host: str) -> dict[str, Any] | None:
        """TF_CONFIG for the parameter server the toolkit runs on ``host``, if it runs one."""
        if host not in self.ps_hosts:
            return None
        return _config(self.cluster(), {"type": "ps", "index": self.ps_hosts.index(host)}, legacy=self.naming == MASTER)


def mwms_config(hosts: Sequence[str], host: str, port: int = TF_MWMS_PORT) -> dict[str, Any]:
    """TF_CONFIG for MultiWorkerMirroredStrategy: one worker per host, indexed by host order."""
    return {"cluster": {"worker": [f"{h}:{port}" for h in hosts]}, "task": {"type": "worker", "index": list(hosts).index(host)}}


def _config(cluster: dict[str, list[str]], task: dict[str, Any], legacy: bool) -> dict[str, Any]:
    config: dict[str, Any] = {"cluster": cluster, "task": task}
    if legacy:
        config["environment"] = "cloud"
    return config
