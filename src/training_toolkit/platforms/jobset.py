"""JobSet (and a plain indexed Job): an index and labels, no framework variables.

A JobSet pod gets ``JOB_COMPLETION_INDEX`` (its index in its Job) from Kubernetes, and
its labels (``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``, ``job-index``,
``restart-attempt``) only through the downward API, as the variables below; its DNS name
is ``<jobset>-<replicatedjob>-<jobindex>-<podindex>.<subdomain>`` (the subdomain is the
JobSet's name unless ``network.subdomain`` says otherwise).  Neither the labels nor the
pod know how many Jobs and pods there are: the manifest says it in
``TRAINING_TOOLKIT_JOBSET_SHAPE`` (``NAME:JOBS:PODS`` per replicated job, in rank order).
No distribution is switched on: the job's hyperparameters choose one.
"""

from __future__ import annotations

from collections.abc import Mapping

from training_toolkit import settings
from training_toolkit.errors import ConfigError
from training_toolkit.platforms.view import JOBSET, PodView, integer

INDEX = "JOB_COMPLETION_INDEX"
# Downward-API variables the manifests set from the JobSet labels:
JOBSET_NAME = "JOBSET_NAME"  # jobset.sigs.k8s.io/jobset-name
REPLICATED_JOB = "REPLICATED_JOB_NAME"  # jobset.sigs.k8s.io/replicatedjob-name
JOB_INDEX = "JOB_INDEX"  # jobset.sigs.k8s.io/job-index
RESTART_ATTEMPT = "JOBSET_RESTART_ATTEMPT"  # jobset.sigs.k8s.io/restart-attempt
SUBDOMAIN = "JOBSET_SUBDOMAIN"  # network.subdomain, when it is not the JobSet's name
SHAPE = settings.variable("jobset_shape").name


def parse_shape(raw: str) -> tuple[tuple[str, int, int], ...]:
    parts = []
    for item in raw.split(","):
        name, jobs, pods = (item.strip().split(":") + ["", ""])[:3]
        if not name or not jobs.isdigit() or not pods.isdigit() or int(jobs) < 1 or int(pods) < 1:
            raise ConfigError(f"environment variable {SHAPE}", None,
                              f"expected NAME:JOBS:PODS[,NAME:JOBS:PODS...], got {raw!r}")
        parts.append((name, int(jobs), int(pods)))
    return tuple(parts)


def view(environ: Mapping[str, str]) -> PodView:
    source = "JobSet pod environment"
    jobset = environ.get(JOBSET_NAME, "")
    if not jobset:
        raise ConfigError(source, JOBSET_NAME, "missing: set it from the label jobset.sigs.k8s.io/jobset-name")
    shape = parse_shape(settings.value_of("jobset_shape", environ) or "")
    subdomain = environ.get(SUBDOMAIN) or jobset
    mine = (environ.get(REPLICATED_JOB, ""), integer(environ, JOB_INDEX, source), integer(environ, INDEX, source))
    hosts, current = [], None
    for name, jobs, pods in shape:
        for j in range(jobs):
            for p in range(pods):
                hosts.append(f"{jobset}-{name}-{j}-{p}.{subdomain}")
                if (name, j, p) == mine:
                    current = hosts[-1]
    if current is None:
        raise ConfigError(source, REPLICATED_JOB, f"pod {mine} is not in the shape {settings.value_of('jobset_shape', environ)!r}")
    attempt = integer(environ, RESTART_ATTEMPT, source) if environ.get(RESTART_ATTEMPT) else 0
    return PodView(JOBSET, tuple(hosts), current, restart_attempt=attempt)
