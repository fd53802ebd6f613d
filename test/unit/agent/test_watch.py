"""The progress watch with its real thread and real files: output and heartbeats become tagged events."""

from __future__ import annotations

import os
import time
from queue import Empty, SimpleQueue

import pytest

from training_toolkit.agent.events import Progress
from training_toolkit.agent.progress import ProgressWatch, latest_mtime, watch_dir


def events_within(queue: SimpleQueue, seconds: float) -> list:
    found, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            found.append(queue.get(timeout=max(0.0, end - time.monotonic())))
        except Empty:
            break
    return found


@pytest.fixture
def watch(tmp_path):
    queue: SimpleQueue = SimpleQueue()
    w = ProgressWatch(queue, tmp_path, interval_s=0.05)
    yield w, queue, tmp_path
    w.close()


def test_many_output_lines_make_one_event_per_interval_tagged_with_their_attempt(watch):
    w, queue, _ = watch
    for _ in range(10_000):
        w.output_seen(0)
    assert events_within(queue, 0.5) == [Progress(False, 0)]
    w.attempt = 1
    w.output_seen(0)  # the last words of attempt 0, seen while attempt 1 starts: still attempt 0's
    assert events_within(queue, 0.5) == [Progress(False, 0)]


def test_a_touched_file_is_a_heartbeat_of_the_running_attempt(watch):
    w, queue, directory = watch
    assert events_within(queue, 0.3) == []
    w.attempt = 2
    (directory / "rank-3").touch()
    assert events_within(queue, 0.5) == [Progress(True, 2)]
    assert events_within(queue, 0.3) == []  # untouched since: nothing more
    later = time.time() + 5
    os.utime(directory / "rank-3", (later, later))
    assert events_within(queue, 0.5) == [Progress(True, 2)]


def test_the_checkpoint_file_touched_is_a_heartbeat_that_marks_a_checkpoint(watch):
    w, queue, directory = watch
    (directory / "rank-0").touch()
    assert events_within(queue, 0.5) == [Progress(True, 0)]
    (directory / "checkpoint").touch()  # the script's one line after it saved
    assert events_within(queue, 0.5) == [Progress(True, 0, checkpoint=True)]
    later = time.time() + 5
    os.utime(directory / "rank-0", (later, later))  # another heartbeat: the mark not touched again, no checkpoint
    assert events_within(queue, 0.5) == [Progress(True, 0)]


def test_latest_mtime(tmp_path):
    assert latest_mtime(tmp_path / "missing") == 0 and latest_mtime(tmp_path) == 0
    (tmp_path / "a").touch()
    os.utime(tmp_path / "a", ns=(5, 7_000_000_000))
    assert latest_mtime(tmp_path) == 7_000_000_000


@pytest.mark.parametrize("job_id, host, prefix", [
    ("0123456789abcdef0123", "node2", "training-toolkit-watch-0123456789abcdef-node2-"),  # the id's first 16
    ("", "algo-1", "training-toolkit-watch-algo-1-"),
    ("zz;rm", "../x y", "training-toolkit-watch-xy-"),  # hex only of the id; no slash, no space, no leading dot
    (None, "", "training-toolkit-watch-"),
])
def test_a_hosts_watch_directory_says_the_job_and_the_host_then_a_random_part(tmp_path, job_id, host, prefix):
    path = watch_dir(job_id, tmp_path, host)
    assert path.parent == tmp_path and path.name.startswith(prefix) and len(path.name) > len(prefix), path.name
    assert path.stat().st_mode & 0o777 == 0o700 and sorted(p.name for p in path.iterdir()) == ["heartbeats", "ranks", "stacks"]
    assert watch_dir(job_id, tmp_path, host) != path  # hosts sharing the parent never share a directory


class _Child:
    """What the stall watch reads of a started process: its pid, and whether it runs."""

    def __init__(self, pid: int, running: bool = True):
        self.pid, self._running = pid, running

    def poll(self):
        return None if self._running else 0


@pytest.mark.process  # tier: the watch directory's dead-man switch is a process
def test_a_stall_shows_the_processes_that_run_the_program_own_children_and_reported_ranks_alike():
    """The same rule for every runner: this host's children that run the program, and the ranks their parents
    reported (MPI's: not train's children); a launcher (mpirun) or the toolkit's own server is not shown."""
    from training_toolkit.agent.stall import StallWatch
    from training_toolkit.runspec import Local
    from training_toolkit.stalls.stacks import Watched
    from training_toolkit.supervise import procfs, reported

    watch = StallWatch(SimpleQueue(), timeout_s=10.0)
    locals_ = [Local("mpirun", _Child(11), program=False), Local("rank 1", _Child(12), rank=1),
               Local("ended", _Child(13, running=False), rank=2)]
    assert watch.watched(locals_) == [Watched(12, 1, "rank 1")]  # not started: no reports read
    watch.start("ab12", "algo-1")
    try:
        me = procfs.read(os.getpid())
        assert me is not None
        (watch.watch_dir / reported.DIR_NAME / str(me.pid)).write_text(f"3 {me.start}\n")
        assert watch.watched(locals_) == [Watched(12, 1, "rank 1"), Watched(me.pid, 3, "rank 3")]
        env = watch.process_env({}, 0)
        assert env["TRAINING_TOOLKIT_RANKS_DIR"] == str(watch.watch_dir / reported.DIR_NAME)
    finally:
        watch.close()
    assert not watch.watch_dir.exists()
