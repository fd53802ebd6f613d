"""The job's cost in one line, on every host's log at the end, in a fixed form a metric's regex reads.

    training-toolkit: summary: attempts=2 faults=1 downtime_s=7.412 running_fraction=0.9120 wall_s=84.213 basis=progress goodput=0.8520; attempt 1: host_lost (algo-1 lost: connection closed) lost 7.412 s (detection 0.000, barrier 5.100, start 2.312) and 5.600 s of work since the last checkpoint

``goodput`` is there only where the script marks its checkpoints (record/cost.py), and so is each fault's work lost.

``METRICS``: a SageMaker metric definition for each figure (docs/resilience.md).
"""

from __future__ import annotations

SHOWN = 10  # faults named in the line: it stays under the channel's 4096 characters (the lead's verdict carries it)
PREFIX = "summary:"  # after the log's own "training-toolkit: "

METRICS = {  # Name -> Regex, as a SageMaker estimator's metric_definitions take them
    "toolkit:attempts": r"training-toolkit: summary: attempts=([0-9]+)",
    "toolkit:faults": r"training-toolkit: summary: .* faults=([0-9]+)",
    "toolkit:downtime_s": r"training-toolkit: summary: .* downtime_s=([0-9.]+)",
    "toolkit:running_fraction": r"training-toolkit: summary: .* running_fraction=([0-9.]+)",
    "toolkit:wall_s": r"training-toolkit: summary: .* wall_s=([0-9.]+)",
    "toolkit:goodput": r"training-toolkit: summary: .* goodput=([0-9.]+)",
}


def line(document: dict) -> str:
    """The summary line of a cost document (``cost.cost``)."""
    fraction = document["running_fraction"]
    head = (f"{PREFIX} attempts={len(document['attempts'])} faults={len(document['faults'])} "
            f"downtime_s={document['downtime_s']:.3f} "
            f"running_fraction={'n/a' if fraction is None else f'{fraction:.4f}'} "
            f"wall_s={document['wall_s']:.3f} basis={document['basis']}"
            + ("" if document.get("goodput") is None else f" goodput={document['goodput']:.4f}"))
    parts = [head]
    faults = document["faults"]
    for fault in faults[:SHOWN]:
        reason = " ".join(str(fault["reason"] or "").split())[:200]
        lost = "the job's end" if fault["lost_s"] is None else f"lost {fault['lost_s']:.3f} s"
        split = ("" if fault["lost_s"] is None else
                 f" (detection {fault['detection_s']:.3f}, barrier {fault['barrier_s']:.3f}, "
                 f"start {fault['start_s']:.3f})")
        work = ("" if fault.get("lost_work_s") is None else
                f" and {fault['lost_work_s']:.3f} s of work since the last checkpoint")
        parts.append(f"attempt {fault['attempt'] + 1}: {fault['fault']} ({reason}) {lost}{split}{work}")
    if len(faults) > SHOWN:
        parts.append(f"{len(faults) - SHOWN} more in the cost document")
    return "; ".join(parts)
