"""Stacks of a stalled job as the user reads them: parsed, grouped, the ranks that differ first.

Pure: text in (faulthandler's or py-spy's dump of one process), text out (the
failure file's lines), so that every rule is an exact test.  What one rank's
stack is travels between hosts as ``RankStack.to_wire``/``from_wire``.

A rank's stack is its main thread's (faulthandler lists the oldest thread, the
main one, last; py-spy names it ``MainThread``); ranks with the same frames form
one group; the smallest groups come first, because in a hang the odd one out is
usually the cause (``rank 3 on algo-2: time.sleep(60) at train.py:6`` before
``ranks 0-2: comm.allreduce(x) at train.py:8``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePath

_FAULTHANDLER_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\s*$")
_FAULTHANDLER_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_PYSPY_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \(([^)]*)\)(?:: "(.*)")?\s*$')
_PYSPY_FRAME = re.compile(r"^\s+(.+?) \((.*):(\d+)\)\s*$")
MAX_FRAMES = 12  # per rank, innermost first, in the failure file
# Frames of what started the script, not of the script: ``python -m mpi4py``, runpy
_LAUNCHER = re.compile(r"^<frozen runpy>$|/runpy\.py$|/mpi4py/(?:run|__main__)\.py$")
# Frames of installed code, not of the script: an installed package, the standard library, frozen modules
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/|^<")
_INSTALLED = re.compile(r"^.*/(?:site|dist)-packages/")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int
    source: str = ""  # the line's text, read on the rank's host (the file is there)

    def where(self) -> str:
        place = f"{PurePath(self.file).name}:{self.line}"
        return f"{self.source} at {place}" if self.source else f"{self.function} at {place}"

    def is_library(self) -> bool:
        """In installed code (a package, the standard library) rather than the script's own."""
        return bool(_LIBRARY.search(self.file))

    def package_place(self) -> str:
        """``torch/cuda/__init__.py:1162``: an installed file by its path inside site-packages, else its name."""
        stripped = _INSTALLED.sub("", self.file)
        return f"{stripped if stripped != self.file else PurePath(self.file).name}:{self.line}"


@dataclass(frozen=True)
class RankStack:
    """One process's main-thread stack, innermost frame first; ``frames`` empty: ``note`` says why."""

    host: str
    rank: int | None  # the job-wide rank, when the process is one
    name: str  # what the process is on its host ("rank 3", "script", "parameter server")
    frames: tuple[Frame, ...] = ()
    note: str = ""  # how it was read (faulthandler, py-spy) or why it could not be

    def to_wire(self) -> dict:
        return {"host": self.host, "rank": self.rank, "name": self.name, "note": self.note,
                "frames": [[f.function, f.file, f.line, f.source] for f in self.frames]}

    @classmethod
    def from_wire(cls, value: object, host: str) -> RankStack | None:
        """A stack another host sent, checked; None if it is not one.  ``host``: who sent it (it cannot claim another)."""
        if not isinstance(value, dict):
            return None
        rank, name, note, frames = value.get("rank"), value.get("name"), value.get("note", ""), value.get("frames")
        if not (rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0)):
            return None
        if not isinstance(name, str) or not isinstance(note, str) or not isinstance(frames, list):
            return None
        parsed = []
        for item in frames[:MAX_FRAMES]:
            if not (isinstance(item, list) and len(item) == 4 and all(isinstance(x, str) for x in item[:2])
                    and isinstance(item[2], int) and isinstance(item[3], str)):
                return None
            parsed.append(Frame(item[0][:200], item[1][:500], item[2], item[3][:200]))
        return cls(host, rank, name[:100], tuple(parsed), note[:300])


def parse_faulthandler(text: str) -> tuple[Frame, ...]:
    """The main thread's frames from a faulthandler dump (the last thread listed), innermost first."""
    blocks: list[list[Frame]] = []
    for line in text.splitlines():
        if _FAULTHANDLER_THREAD.match(line):
            blocks.append([])
        elif (match := _FAULTHANDLER_FRAME.match(line)) and blocks:
            blocks[-1].append(Frame(match.group(3), match.group(1), int(match.group(2))))
    return tuple(blocks[-1]) if blocks else ()


def parse_pyspy(text: str) -> tuple[Frame, ...]:
    """The main thread's frames from ``py-spy dump`` (the thread named MainThread, else the first), innermost first."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        if match := _PYSPY_THREAD.match(line):
            threads.append((match.group(2) or "", []))
        elif (match := _PYSPY_FRAME.match(line)) and threads:
            threads[-1][1].append(Frame(match.group(1), match.group(2), int(match.group(3))))
    if not threads:
        return ()
    main = next((frames for name, frames in threads if name == "MainThread"), threads[0][1])
    return tuple(main)


def without_launcher(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """The frames without the outermost ones of what started the script (runpy, ``python -m mpi4py``)."""
    end = len(frames)
    while end > 0 and _LAUNCHER.search(frames[end - 1].file):
        end -= 1
    return tuple(frames[:end]) if end else tuple(frames)


def with_source(frames: Iterable[Frame], getline: Callable[[str, int], str], cwd: str | None = None) -> tuple[Frame, ...]:
    """Each frame with its line's text (``linecache.getline`` on the host that read the stack).

    A relative file name (``python train.py``) is the process's own: it is read from ``cwd``, the process's directory.
    """
    def text(f: Frame) -> str:
        path = f.file if f.file.startswith(("/", "<")) or cwd is None else str(PurePath(cwd) / f.file)
        return getline(path, f.line).strip()[:200]

    return tuple(Frame(f.function, f.file, f.line, text(f)) for f in frames)


def ranges(numbers: Sequence[int]) -> str:
    """``0-2, 5``: sorted numbers as ranges."""
    out: list[str] = []
    ordered = sorted(set(numbers))
    start = prev = None
    for n in ordered:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = n
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(out)


def label(stacks: Sequence[RankStack]) -> str:
    """Who is in a group: ``rank 3 on algo-2``, ``ranks 0-2 on algo-1, algo-2``, ``script on algo-1``."""
    hosts = ", ".join(dict.fromkeys(s.host for s in stacks))
    ranks = [s.rank for s in stacks if s.rank is not None]
    if len(ranks) == len(stacks):
        return f"{'rank' if len(ranks) == 1 else 'ranks'} {ranges(ranks)} on {hosts}"
    names = ", ".join(dict.fromkeys(s.name for s in stacks))
    return f"{names} on {hosts}"


def group(stacks: Sequence[RankStack]) -> list[list[RankStack]]:
    """Ranks with the same frames together; smallest groups first (the odd ones out), then by first rank."""
    groups: dict[tuple, list[RankStack]] = {}
    for stack in stacks:
        key = tuple((f.function, PurePath(f.file).name, f.line) for f in stack.frames) or ("no stack", stack.note)
        groups.setdefault(key, []).append(stack)

    def order(members: list[RankStack]) -> tuple:
        first = min((s.rank for s in members if s.rank is not None), default=1 << 30)
        return (not members[0].frames, len(members), first, members[0].host)

    return sorted(groups.values(), key=order)


def where_stuck(frames: Sequence[Frame]) -> str:
    """Where a stack is, for the one-line summary: the script's own innermost line, and the library call it is in.

    A rank blocked in a pure-Python library (``torch.cuda.synchronize()``, a data loader's queue)
    has that library's frames innermost; the user's question is which of *their* lines it is on:
    ``torch.cuda.synchronize() at train.py:56, in synchronize at torch/cuda/__init__.py:1162``.
    A stack with no frame of the script's own is named by its innermost frame.
    """
    own = next((f for f in frames if not f.is_library()), None)
    if own is None or own is frames[0]:
        return frames[0].where()
    inner = frames[0]
    return f"{own.where()}, in {inner.function} at {inner.package_place()}"


def summary(stacks: Sequence[RankStack]) -> str:
    """One line: every group and where it is (the script's innermost line), the ranks that differ first."""
    parts = []
    for members in group(stacks):
        head = members[0]
        where = where_stuck(head.frames) if head.frames else f"no stack ({head.note or 'not read'})"
        parts.append(f"{label(members)}: {where}")
    return "; ".join(parts) if parts else "no rank's stack could be read"


def details(stacks: Sequence[RankStack]) -> list[str]:
    """The failure file's section: each group's frames, innermost first, and how they were read."""
    lines = ["stacks (main thread, most recent call first; ranks that differ from the rest first):"]
    for members in group(stacks):
        how = ", ".join(sorted({s.note for s in members if s.note}))
        lines.append(f"{label(members)}{f' ({how})' if how else ''}:")
        for frame in members[0].frames[:MAX_FRAMES]:
            lines.append(f"  {frame.function} at {frame.file}:{frame.line}" + (f": {frame.source}" if frame.source else ""))
        if not members[0].frames:
            lines.append("  (no stack)")
    return lines
