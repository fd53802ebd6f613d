"""A stalled job's stacks as the user reads them: parsing both dumps, grouping, ordering, the wire."""

from __future__ import annotations

from training_toolkit.stalls.stackreport import (Frame, RankStack, details, group, label, parse_faulthandler, parse_pyspy,
                                          ranges, summary, with_source, without_launcher)

FAULTHANDLER = """\
Thread 0x00007f1e2d7fe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f1e3b3c4740 (most recent call first):
  File "train.py", line 6 in hang
  File "train.py", line 9 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/venv/lib/python3.11/site-packages/mpi4py/run.py", line 53 in run_command_line
"""

PYSPY = """\
Process 8723: /venv/bin/python train.py
Python v3.11.7 (/venv/bin/python3.11)

Thread 8730 (idle): "Thread-1"
    wait (/usr/lib/python3.11/threading.py:324)
Thread 8723 (idle): "MainThread"
    hang (/code/train.py:6)
    <module> (/code/train.py:9)
"""


def test_faulthandler_dump_the_main_thread_is_the_last_listed():
    assert parse_faulthandler(FAULTHANDLER) == (
        Frame("hang", "train.py", 6), Frame("<module>", "train.py", 9), Frame("_run_code", "<frozen runpy>", 88),
        Frame("run_command_line", "/venv/lib/python3.11/site-packages/mpi4py/run.py", 53))
    assert parse_faulthandler("") == () and parse_faulthandler("garbage\n  File x") == ()


def test_pyspy_dump_the_main_thread_by_name():
    assert parse_pyspy(PYSPY) == (Frame("hang", "/code/train.py", 6), Frame("<module>", "/code/train.py", 9))
    assert parse_pyspy("Error: Permission denied (os error 13)") == ()


def test_the_launchers_frames_are_dropped_and_sources_read_from_the_process_directory():
    frames = without_launcher(parse_faulthandler(FAULTHANDLER))
    assert [f.function for f in frames] == ["hang", "<module>"]
    lines = {("/code/train.py", 6): "    time.sleep(3600)\n", ("/code/train.py", 9): "hang()\n"}
    sourced = with_source(frames, lambda path, n: lines.get((path, n), ""), cwd="/code")
    assert [f.source for f in sourced] == ["time.sleep(3600)", "hang()"]
    assert sourced[0].where() == "time.sleep(3600) at train.py:6"
    assert Frame("f", "/a/b.py", 3).where() == "f at b.py:3"  # no source: the function


def test_ranges_and_labels():
    assert ranges([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8" and ranges([]) == ""
    assert label([RankStack("algo-2", 3, "rank 3")]) == "rank 3 on algo-2"
    assert label([RankStack("algo-1", r, f"rank {r}") for r in (0, 1)] + [RankStack("algo-2", 2, "rank 2")]) == \
        "ranks 0-2 on algo-1, algo-2"
    assert label([RankStack("algo-1", None, "script")]) == "script on algo-1"


ALLREDUCE = (Frame("<module>", "/code/train.py", 8, "total = comm.allreduce(x)"),)
SLEEP = (Frame("hang", "/code/train.py", 6, "time.sleep(3600)"), Frame("<module>", "/code/train.py", 9, "hang()"))


def stalled_job():
    return [RankStack("algo-1", 0, "rank 0", ALLREDUCE, "faulthandler"),
            RankStack("algo-1", 1, "rank 1", ALLREDUCE, "faulthandler"),
            RankStack("algo-2", 2, "rank 2", ALLREDUCE, "py-spy"),
            RankStack("algo-2", 3, "rank 3", SLEEP, "faulthandler"),
            RankStack("algo-2", 4, "rank 4", (), "py-spy: Permission denied")]


def test_the_ranks_that_differ_come_first_unreadable_ones_last():
    groups = group(stalled_job())
    assert [[s.rank for s in g] for g in groups] == [[3], [0, 1, 2], [4]]
    assert summary(stalled_job()) == ("rank 3 on algo-2: time.sleep(3600) at train.py:6; "
                                      "ranks 0-2 on algo-1, algo-2: total = comm.allreduce(x) at train.py:8; "
                                      "rank 4 on algo-2: no stack (py-spy: Permission denied)")
    assert details(stalled_job()) == [
        "stacks (main thread, most recent call first; ranks that differ from the rest first):",
        "rank 3 on algo-2 (faulthandler):",
        "  hang at /code/train.py:6: time.sleep(3600)",
        "  <module> at /code/train.py:9: hang()",
        "ranks 0-2 on algo-1, algo-2 (faulthandler, py-spy):",
        "  <module> at /code/train.py:8: total = comm.allreduce(x)",
        "rank 4 on algo-2 (py-spy: Permission denied):",
        "  (no stack)",
    ]
    assert summary([]) == "no rank's stack could be read"


def test_the_wire_form_round_trips_and_a_host_cannot_speak_for_another():
    stack = stalled_job()[3]
    assert RankStack.from_wire(stack.to_wire(), "algo-2") == stack
    claimed = {**stack.to_wire(), "host": "algo-9"}
    assert RankStack.from_wire(claimed, "algo-2").host == "algo-2"


def test_what_is_not_a_stack_is_refused():
    good = stalled_job()[3].to_wire()
    for bad in (None, [], {**good, "rank": -1}, {**good, "rank": True}, {**good, "name": 3},
                {**good, "frames": "x"}, {**good, "frames": [["f", "file", "6", ""]]}, {**good, "frames": [["f"]]}):
        assert RankStack.from_wire(bad, "algo-2") is None, bad


def test_a_rank_blocked_inside_a_library_is_named_by_the_scripts_own_line():
    """Seen on an H200 (docs/gpu.md): a rank in torch.cuda.synchronize() has torch's frame innermost."""
    cuda = RankStack("algo-1", 0, "rank 0", (
        Frame("synchronize", "/opt/venv/lib/python3.12/site-packages/torch/cuda/__init__.py", 1162,
              "return torch._C._cuda_synchronize()"),
        Frame("<module>", "/opt/ml/code/train.py", 56, "torch.cuda.synchronize()"),
        Frame("_run_code", "<frozen runpy>", 88)))
    assert summary([cuda]) == ("rank 0 on algo-1: torch.cuda.synchronize() at train.py:56, "
                               "in synchronize at torch/cuda/__init__.py:1162")
    stdlib = RankStack("algo-1", 1, "rank 1", (
        Frame("wait", "/usr/lib/python3.11/threading.py", 324), Frame("get", "/usr/lib/python3.11/queue.py", 171),
        Frame("step", "/code/loader.py", 9, "batch = q.get()")))
    assert summary([stdlib]) == "rank 1 on algo-1: batch = q.get() at loader.py:9, in wait at threading.py:324"
    only_library = RankStack("algo-1", 2, "rank 2", (Frame("run", "/venv/lib/python3.11/site-packages/pkg/cli.py", 3),))
    assert summary([only_library]) == "rank 2 on algo-1: run at cli.py:3"
    assert summary(stalled_job()[3:4]) == "rank 3 on algo-2: time.sleep(3600) at train.py:6"  # the script's frame innermost: as before
