"""The open-files limit a first host raises for its hosts: the rule exactly, and once for real in a child."""

from __future__ import annotations

import pytest
import resource
import subprocess
import sys

from training_toolkit.cluster.limits import open_files_needed, soft_limit_for

INF = resource.RLIM_INFINITY


def test_the_soft_limit_rises_to_what_is_needed_within_the_hard_limit_and_never_falls():
    assert soft_limit_for(1024, 1048576, 8256) == 8256
    assert soft_limit_for(1024, 4096, 8256) == 4096  # as far as the hard limit allows
    assert soft_limit_for(1024, INF, 8256) == 8256
    assert soft_limit_for(20000, 1048576, 8256) == 20000  # already enough: unchanged
    assert open_files_needed(1000) == 8256


CHILD = """
import resource
from training_toolkit.cluster.limits import raise_open_files
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(*raise_open_files(1000), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


@pytest.mark.process
def test_a_process_with_a_low_soft_limit_raises_it():
    soft, hard, now = map(int, subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                                              check=True, timeout=60).stdout.split())
    expected = 1000 if hard == INF or hard >= 1000 else hard
    assert soft == now == expected
