"""A plain indexed Job (``completionMode: Indexed``), no JobSet: an index, a hostname, maybe a subdomain.

Kubernetes gives each pod ``JOB_COMPLETION_INDEX`` and the hostname ``<job>-<index>``
(``pkg/controller/job``); nothing else, not the completions.  Its peers resolve only when the
manifest sets ``subdomain`` and a headless Service of that name, and the kubelet's /etc/hosts
then names the pod ``<job>-<i>.<subdomain>.<ns>.svc``.  The manifest says how many pods there
are in ``TRAINING_TOOLKIT_COMPLETIONS``; one pod needs neither.
"""

from __future__ import annotations

from training_toolkit.core.errors import ConfigError
from training_toolkit.platforms.jobset import INDEX, JOBSET_NAME
from training_toolkit.platforms.kubernetes import PodPlatform, in_a_pod, pod_name
from training_toolkit.platforms.view import EMPTY, Facts, integer

SOURCE = "indexed Job pod"


class IndexedJob(PodPlatform):
    name = "job"

    def detected(self, facts: Facts) -> bool:
        env = facts.environ
        return in_a_pod(facts) and bool(env.get(INDEX)) and not env.get(JOBSET_NAME)

    def hosts_of(self, facts: Facts):
        index = integer(facts.environ, INDEX, SOURCE)
        suffix = f"-{index}"
        if not facts.hostname.endswith(suffix) or facts.hostname == suffix:
            raise ConfigError(SOURCE, "hostname", f"expected <job>{suffix}, got {facts.hostname!r}")
        job = facts.hostname[: -len(suffix)]
        count = facts.settings.completions or 1
        if index >= count:
            raise ConfigError(SOURCE, INDEX, f"index {index} of {count} pods (TRAINING_TOOLKIT_COMPLETIONS)")
        if count == 1:
            return (facts.hostname,), facts.hostname, EMPTY, 0
        subdomain = pod_name(facts).subdomain
        if subdomain is None:
            raise ConfigError(SOURCE, "subdomain", "the pods of a Job resolve each other only with spec.subdomain "
                              "and a headless Service of that name; this pod has no subdomain")
        hosts = tuple(f"{job}-{i}.{subdomain}" for i in range(count))
        return hosts, hosts[index], EMPTY, 0
