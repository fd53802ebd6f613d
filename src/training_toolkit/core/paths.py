"""The layout of the job directory (``/opt/ml`` by default).

Only a value object: building one touches nothing on disk.  Launch-path value
types are ``NamedTuple``s: as immutable as frozen dataclasses, without the
cost of importing ``dataclasses`` on every start (see docs/benchmarks.md).
"""

from __future__ import annotations

import os
from typing import NamedTuple
from pathlib import Path


class Paths(NamedTuple):
    base: Path

    @classmethod
    def at(cls, base_dir: str) -> "Paths":
        """The layout under ``base_dir`` (``Settings.base_dir``), made absolute."""
        return cls(Path(os.path.abspath(base_dir)))

    @property
    def input_dir(self) -> Path:
        return self.base / "input"

    @property
    def input_config_dir(self) -> Path:
        return self.base / "input" / "config"

    @property
    def hyperparameters_file(self) -> Path:
        return self.input_config_dir / "hyperparameters.json"

    @property
    def resource_config_file(self) -> Path:
        return self.input_config_dir / "resourceconfig.json"

    @property
    def input_data_config_file(self) -> Path:
        return self.input_config_dir / "inputdataconfig.json"

    @property
    def job_secret_file(self) -> Path:
        return self.input_config_dir / "job_secret"

    @property
    def data_dir(self) -> Path:
        return self.base / "input" / "data"

    def channel_dir(self, channel: str) -> Path:
        return self.data_dir / channel

    @property
    def model_dir(self) -> Path:
        return self.base / "model"

    @property
    def output_dir(self) -> Path:
        return self.base / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.base / "output" / "data"

    @property
    def output_intermediate_dir(self) -> Path:
        return self.base / "output" / "intermediate"

    @property
    def success_file(self) -> Path:
        return self.output_dir / "success"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    @property
    def code_dir(self) -> Path:
        return self.base / "code"
