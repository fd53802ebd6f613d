"""``training-toolkit timeline DIR``: the job drawn from its records: hosts as rows, time across.

``layout`` is pure: every host's record found under ``DIR`` (a job directory, or ``local``'s work
directory with every host's tree) in, what the picture shows out: each host's role per attempt
(lead, active, spare, lost), each fault with its cause, the time each fault cost (shaded), and the
figures of the job's cost for the title.  The job's view is the record of the last attempt's lead
(it saw every fault of the attempts it led); the roles come from every record's attempts, the faults
from every record (each fault once, as first seen).  ``draw`` renders it with matplotlib, an optional
extra (``pip install 'training-toolkit[timeline]'``): the image and a minimal install do without.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from training_toolkit.record import cost, schema, summary

ROLES = ("lead", "active", "spare", "lost")
COLOURS = {"lead": "#1f5fa8", "active": "#5b9bd5", "spare": "#c9c9c9", "lost": "#e8e8e8"}


class NoPlotting(Exception):
    """matplotlib is not installed (the optional extra ``timeline``)."""


class Segment(NamedTuple):
    host: str
    role: str
    start: float  # seconds from the job's first entry
    end: float
    attempt: int


class Mark(NamedTuple):
    t: float
    attempt: int
    fault: str
    host: str | None
    label: str


class Picture(NamedTuple):
    hosts: tuple[str, ...]  # rows, in the platform's order
    segments: tuple[Segment, ...]
    marks: tuple[Mark, ...]
    shaded: tuple[tuple[float, float], ...]  # the time each fault cost
    title: str
    end: float


def find_records(directory: Path) -> dict[str, list[dict]]:
    """Every host's record under ``directory`` (its own file name says the host), read."""
    found = {}
    for path in sorted(directory.rglob(f"{schema.DIR_NAME}/record-*.jsonl")):
        host = path.name[len("record-"):-len(".jsonl")]
        entries = schema.read(path)
        if entries:
            found.setdefault(host, entries)
    return found


def layout(records: Mapping[str, Sequence[dict]]) -> Picture:
    """What the picture shows, from every host's record (pure)."""
    every = [item for entries in records.values() for item in entries]
    if not every:
        raise ValueError("no record of a job")
    t0 = min(item["t"] for item in every)
    seats: dict[int, dict] = {}
    for item in sorted(every, key=lambda i: i["t"]):
        if item["kind"] == "attempt":
            seats.setdefault(item["attempt"], item)
    numbers = sorted(seats)
    lead = seats[numbers[-1]]["lead"] if numbers else next(iter(records))
    job = list(records.get(lead) or next(iter(records.values())))
    document = cost.cost(job)
    end = max(item["t"] for item in every) - t0
    hosts = _hosts(records, every)
    segments = []
    for i, number in enumerate(numbers):
        seat = seats[number]
        start = seat["t"] - t0
        stop = seats[numbers[i + 1]]["t"] - t0 if i + 1 < len(numbers) else end
        for host in hosts:
            role = ("lead" if host == seat["lead"] else "active" if host in seat["active"]
                    else "spare" if host in seat["spares"] else "lost")
            segments.append(Segment(host, role, round(start, 3), round(stop, 3), number))
    marks = _marks(every, t0)
    segments = _split_at_losses(segments, marks)
    shaded = tuple((round(f["detected_t"] - f["detection_s"] - t0, 3),
                    round(f["detected_t"] - t0 + (f["barrier_s"] or 0.0) + (f["start_s"] or 0.0), 3))
                   for f in document["faults"] if f["lost_s"] is not None)
    return Picture(tuple(hosts), tuple(segments), marks, shaded, summary.line(document).split(";")[0], round(end, 3))


def _split_at_losses(segments: list[Segment], marks: Sequence[Mark]) -> list[Segment]:
    """A host lost during an attempt is drawn lost from its loss on."""
    lost = {(mark.host, mark.attempt): mark.t for mark in marks if mark.fault == "host_lost"}
    split = []
    for segment in segments:
        at = lost.get((segment.host, segment.attempt))
        if at is None or not segment.start < at < segment.end:
            split.append(segment)
            continue
        split += [segment._replace(end=at), segment._replace(role="lost", start=at)]
    return split


def _hosts(records: Mapping[str, Sequence[dict]], every: Sequence[dict]) -> list[str]:
    """The job's hosts in the platform's order (a ``job`` entry's), then any other host a record names."""
    hosts: list[str] = []
    for item in every:
        if item["kind"] == "job":
            hosts = list(item["hosts"])
            break
    for item in every:
        for host in ([item["lead"], *item["active"], *item["spares"]] if item["kind"] == "attempt" else []):
            if host not in hosts:
                hosts.append(host)
    return hosts + [host for host in records if host not in hosts]


def _marks(every: Sequence[dict], t0: float) -> tuple[Mark, ...]:
    """Each fault once (by attempt, kind and host), when it was first seen."""
    seen: dict[tuple, Mark] = {}
    for item in sorted((i for i in every if i["kind"] == "fault"), key=lambda i: i["t"]):
        key = (item["attempt"], item["fault"], item["host"])
        if key not in seen:
            reason = " ".join(str(item["reason"] or "").split())
            label = f"{item['fault']}: {reason[:60]}" + ("..." if len(reason) > 60 else "")
            seen[key] = Mark(round(item["t"] - t0, 3), item["attempt"], item["fault"], item["host"], label)
    return tuple(seen.values())


def draw(picture: Picture, output: Path) -> None:
    """Render ``picture`` to ``output`` (its suffix says the format: .png, .svg, .pdf); text stays text in an SVG."""
    try:
        import matplotlib
    except ImportError:
        raise NoPlotting("timeline: drawing needs matplotlib: pip install 'training-toolkit[timeline]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    plt.rcParams["svg.fonttype"] = "none"
    rows = list(picture.hosts)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(rows)))
    for segment in picture.segments:
        y = len(rows) - 1 - rows.index(segment.host)
        ax.broken_barh([(segment.start, max(segment.end - segment.start, 1e-3))], (y - 0.35, 0.7),
                       facecolors=COLOURS[segment.role], edgecolors="white", linewidth=0.5)
    for start, stop in picture.shaded:
        ax.axvspan(start, stop, color="#f4a6a6", alpha=0.45, zorder=0)
    for i, mark in enumerate(picture.marks):
        ax.axvline(mark.t, color="#c00000", linewidth=1)
        y = len(rows) - 1 - rows.index(mark.host) if mark.host in rows else len(rows) - 0.5
        ax.annotate(mark.label, (mark.t, y + 0.4), xytext=(3, 2 + 8 * (i % 2)), textcoords="offset points",
                    fontsize=7, color="#c00000")
    ax.set_yticks(range(len(rows)), list(reversed(rows)))
    ax.set_xlim(0, max(picture.end, 1e-3) * 1.02)
    ax.set_ylim(-0.6, len(rows) + 0.2)
    ax.set_xlabel("seconds since the job's first entry")
    ax.set_title(picture.title.removeprefix(summary.PREFIX).strip(), fontsize=9)
    handles = [Patch(color=COLOURS[role], label=role) for role in ROLES]
    handles.append(Patch(color="#f4a6a6", alpha=0.45, label="time lost"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(handles), fontsize=8,
              frameon=False)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main(directory: Path, output: Path | None) -> int:
    """The command: draw the job whose records are under ``directory``; the picture's path on stdout."""
    from training_toolkit.core.errors import EXIT_USAGE
    from training_toolkit.core.log import log

    records = find_records(directory)
    if not records:
        log(f"timeline: no record of a job under {directory} (each host writes {schema.DIR_NAME}/record-HOST.jsonl "
            "under its output data directory)")
        return EXIT_USAGE
    output = output or directory / "timeline.png"
    try:
        draw(layout(records), output)
    except NoPlotting as exc:
        log(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        log(f"timeline: cannot write {output}: {exc.strerror or exc}")
        return EXIT_USAGE
    print(output)
    return 0
