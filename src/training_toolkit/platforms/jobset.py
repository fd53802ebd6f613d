"""JobSet: an index, a hostname and a subdomain; the shape comes from the manifest.

A JobSet pod gets no variable from JobSet itself: ``JOB_COMPLETION_INDEX`` comes from its
indexed Job; its labels (``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``,
``job-index``, ``restart-attempt``) reach it only through the manifest's downward API, as the
variables below.  Its hostname is ``<jobset>-<replicatedjob>-<jobindex>-<podindex>`` and only
``<hostname>.<subdomain>`` (and longer) resolves, not the bare name; the subdomain (the
JobSet's name unless ``network.subdomain`` says otherwise) is read from the kubelet's
``/etc/hosts``.  Pods cannot see how many Jobs and pods there are: the manifest says it in
``TRAINING_TOOLKIT_JOBSET_SHAPE`` (``NAME:JOBS:PODS`` per replicated job, in rank order;
``replicatedjob-replicas`` is one replicated job's Jobs, not every job's pods).  No
distribution is switched on: the job's hyperparameters choose one.
"""

from __future__ import annotations

from training_toolkit.core.errors import ConfigError
from training_toolkit.platforms.kubernetes import PodPlatform, in_a_pod, pod_name
from training_toolkit.platforms.view import EMPTY, Facts, integer

INDEX = "JOB_COMPLETION_INDEX"
# Downward-API variables the manifests set from the JobSet labels:
JOBSET_NAME = "JOBSET_NAME"  # jobset.sigs.k8s.io/jobset-name
REPLICATED_JOB = "REPLICATED_JOB_NAME"  # jobset.sigs.k8s.io/replicatedjob-name
JOB_INDEX = "JOB_INDEX"  # jobset.sigs.k8s.io/job-index
RESTART_ATTEMPT = "JOBSET_RESTART_ATTEMPT"  # jobset.sigs.k8s.io/restart-attempt
SHAPE = "TRAINING_TOOLKIT_JOBSET_SHAPE"
SOURCE = "JobSet pod environment"


class JobSet(PodPlatform):
    name = "jobset"

    def detected(self, facts: Facts) -> bool:
        return in_a_pod(facts) and bool(facts.environ.get(JOBSET_NAME))

    def hosts_of(self, facts: Facts):
        env = facts.environ
        jobset = env.get(JOBSET_NAME, "")
        if not jobset:
            raise ConfigError(SOURCE, JOBSET_NAME, "missing: set it from the label jobset.sigs.k8s.io/jobset-name")
        if not facts.settings.jobset_shape:
            raise ConfigError(SOURCE, SHAPE, "missing: the manifest must say NAME:JOBS:PODS per replicated job")
        shape = parse_shape(facts.settings.jobset_shape)
        subdomain = pod_name(facts).subdomain
        if subdomain is None:
            raise ConfigError("/etc/hosts", None, f"no line names this pod as {facts.hostname}.<subdomain>.<ns>.svc: "
                              "JobSet gives every pod a subdomain unless network.enableDNSHostnames is false")
        mine = (env.get(REPLICATED_JOB, ""), integer(env, JOB_INDEX, SOURCE), integer(env, INDEX, SOURCE))
        hosts, current = hosts_in_shape(jobset, subdomain, shape, mine)
        attempt = integer(env, RESTART_ATTEMPT, SOURCE) if env.get(RESTART_ATTEMPT) else 0
        return hosts, current, EMPTY, attempt


def parse_shape(raw: str) -> tuple[tuple[str, int, int], ...]:
    parts = []
    for item in raw.split(","):
        name, jobs, pods = (item.strip().split(":") + ["", ""])[:3]
        if not name or not jobs.isdigit() or not pods.isdigit() or int(jobs) < 1 or int(pods) < 1:
            raise ConfigError(f"environment variable {SHAPE}", None,
                              f"expected NAME:JOBS:PODS[,NAME:JOBS:PODS...], got {raw!r}")
        parts.append((name, int(jobs), int(pods)))
    return tuple(parts)


def hosts_in_shape(jobset: str, subdomain: str, shape, mine: tuple[str, int, int]) -> tuple[tuple[str, ...], str]:
    hosts, current = [], None
    for name, jobs, pods in shape:
        for j in range(jobs):
            for p in range(pods):
                hosts.append(f"{jobset}-{name}-{j}-{p}.{subdomain}")
                if (name, j, p) == mine:
                    current = hosts[-1]
    if current is None:
        raise ConfigError(SOURCE, REPLICATED_JOB, f"pod {mine} is not in the shape {SHAPE}")
    return tuple(hosts), current
