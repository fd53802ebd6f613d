"""What a cluster's leftover check counts as its own (local/teardown.py).  One child process; no root, no namespace made."""

from __future__ import annotations

import pytest
import subprocess
import time

from training_toolkit.supervise import procfs
from training_toolkit.local import teardown

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)


def test_a_process_started_after_the_teardown_ended_is_not_a_leftover():
    """A freed namespace's number goes to the next namespace made: what starts in it later is another cluster's."""
    before = teardown.boot_ticks()
    time.sleep(0.05)  # a clock tick is 10 ms: the child starts in a later one
    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        after = teardown.boot_ticks()
        here = {procfs.netns_of(child.pid): "here"}
        mine = f"process {child.pid} (sleep) in network namespace here"
        assert mine in teardown.processes_in(here)  # every process, as before
        assert mine in teardown.processes_in(here, started_by=after)  # it started before the teardown ended
        assert mine not in teardown.processes_in(here, started_by=before)  # it started after
        assert procfs.read(child.pid).start <= after  # the two clocks are one
    finally:
        child.kill()
        child.wait()
