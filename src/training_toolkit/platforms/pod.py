"""A plain pod (or Job) with no operator's facts: one host, alone.

A pod named like a TFJob replica (``<job>-<type>-<i>``) with ``i > 0`` and no ``TF_CONFIG``
is one replica of a distributed TFJob whose container is not named ``tensorflow`` (the
training-operator gives ``TF_CONFIG`` to that container only): run alone, every replica would
train by itself and report success.  It is refused by name; ``TRAINING_TOOLKIT_PLATFORM=pod``
runs it alone all the same.
"""

from __future__ import annotations

import re

from training_toolkit.core.errors import ConfigError
from training_toolkit.platforms.kubernetes import PodPlatform
from training_toolkit.platforms.tfjob import CONTAINER, VARIABLE
from training_toolkit.platforms.view import Facts

_TFJOB_REPLICA = re.compile(r"^(?P<job>.+)-(?P<type>chief|master|worker|ps|evaluator)-(?P<index>\d+)$")


class Pod(PodPlatform):
    name = "pod"

    def hosts_of(self, facts: Facts):
        replica = _TFJOB_REPLICA.match(facts.hostname)
        if replica and int(replica["index"]) > 0 and "platform" not in facts.settings.given:
            raise ConfigError(f"environment variable {VARIABLE}", None,
                              f"missing in pod {facts.hostname}, replica {replica['type']} {replica['index']} of "
                              f"what looks like TFJob {replica['job']}: the training-operator sets it only in the "
                              f"container named {CONTAINER!r}; name the container {CONTAINER!r} "
                              "(or set TRAINING_TOOLKIT_PLATFORM=pod to run this pod alone)")
        return super().hosts_of(facts)
