"""SageMaker: ``/opt/ml`` is the job, as the platform laid it out; nothing to adapt, nothing to wait for.

It is the registry's last entry, so it is what every container without another platform's
facts is (the local launchers' hosts included: they lay out ``/opt/ml`` as SageMaker does).
"""

from __future__ import annotations

from training_toolkit.job.spec import parse_json_object
from training_toolkit.platforms.view import Facts, JobView
from training_toolkit.config.settings import Settings


class SageMaker:
    name = "sagemaker"

    def detected(self, facts: Facts) -> bool:
        return True

    def view(self, facts: Facts) -> JobView:
        """The hosts as resourceconfig.json names them, for the log and ``plan``; the files stay as they are."""
        source = str(facts.paths.resource_config_file)
        text = facts.read(source)
        raw = parse_json_object(text, source) if text is not None else {}
        hosts = raw.get("hosts") if isinstance(raw.get("hosts"), list) else []
        return JobView(self.name, tuple(str(h) for h in hosts), str(raw.get("current_host", "")),
                       raw.get("network_interface_name"), given=True)

    def wait(self, view: JobView, settings: Settings) -> None:
        pass  # SageMaker starts a job once every host has started

    def report_end(self, facts: Facts, view: JobView | None, exit_code: int, reason: str | None) -> None:
        pass  # output/success or output/failure is SageMaker's way, and job/report.py writes it
