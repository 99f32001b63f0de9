"""A Gantt chart of a simulated iteration: one row per rank, forwards and backwards in two colours.

The backwards of a recomputing stage (`Stage.recompute`: they run the forward again) are hatched.

White space is idle time (the bubbles); light grey is a rank that is ready to compute but
waits for a CPU core (clusters whose ranks share fewer cores than they are, such as
`local-cpu`). The title carries the iteration time, the throughput and the bubble.
Micro-batch numbers are written on the compute boxes wide enough to hold them.
"""

from __future__ import annotations

import os

from graphpipe.simulation.result import Event, SimResult

COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "all_reduce": "#55A868", "step": "#8C8C8C",
           "core_wait": "#E2E2E2"}
RECOMPUTE_HATCH = "////"
LABELS = {"forward": "forward", "backward": "backward", "all_reduce": "all-reduce", "step": "optimizer step",
          "core_wait": "waiting for a CPU core"}


def render_gantt(result: SimResult, path: str | os.PathLike[str], *, title: str = "",
                 time_limit_ms: float | None = None) -> str:
    """Draw `result`'s timeline to `path` (PNG, or any format matplotlib knows from the suffix).

    `time_limit_ms` fixes the time axis, so that charts of different plans compare by eye.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = _rows(result)
    end_ms = max(time_limit_ms or result.iteration_time_s * 1e3, 1e-9)
    fig_w = 14.0
    fig, ax = plt.subplots(figsize=(fig_w, 1.6 + 0.42 * len(rows)))
    busiest = max((len(events) for _, _, events in rows), default=0)
    edge_w = 0.4 if busiest <= 80 else 0.0  # thin white separators only while the boxes are wide
    recomputing = set(result.recompute_stages)
    for y, (_, stage, events) in enumerate(rows):
        for kind, colour in COLOURS.items():  # one collection per row and kind: fast for long schedules
            spans = [(e.start_ms, e.duration_ms) for e in events if e.kind == kind and e.duration_ms > 0]
            if spans:
                hatched = kind == "backward" and stage in recomputing
                ax.broken_barh(spans, (y - 0.36, 0.72), facecolors=colour, edgecolor="white", linewidth=edge_w,
                               hatch=RECOMPUTE_HATCH if hatched else None)
        for event in events:
            _label(ax, event, y, end_ms, fig_w)
    ax.set_yticks(range(len(rows)), [f"rank {rank} · s{stage}" for rank, stage, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, end_ms)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    kinds = [k for k in COLOURS if any(e.kind == k and e.duration_ms > 0 for _, _, evs in rows for e in evs)]
    handles = [Patch(color=COLOURS[k], label=LABELS[k]) for k in kinds]
    if recomputing and any(stage in recomputing for _, stage, _ in rows):
        handles.append(Patch(facecolor=COLOURS["backward"], edgecolor="white", hatch=RECOMPUTE_HATCH,
                             label="backward recomputing its forward"))
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(handles), frameon=False,
              fontsize=8)
    head = f"{title}\n" if title else ""
    ax.set_title(f"{head}{result.schedule}: {result.iteration_time_s * 1e3:.2f} ms/iteration, "
                 f"{result.samples_per_s:,.1f} samples/s, bubble {result.mean_bubble_fraction:.0%} mean / "
                 f"{result.max_bubble_fraction:.0%} max", fontsize=10, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _rows(result: SimResult) -> list[tuple[int, int, list[Event]]]:
    """(rank, stage, its compute events and core waits) for every rank, in rank order."""
    by_rank: dict[int, tuple[int, list[Event]]] = {}
    for event in result.timeline.events:
        if event.kind not in COLOURS:
            continue
        for rank in event.ranks:
            by_rank.setdefault(rank, (event.stage, []))[1].append(event)
    return [(rank, stage, events) for rank, (stage, events) in sorted(by_rank.items())]


def _label(ax: object, event: Event, y: int, end_ms: float, fig_w: float) -> None:
    """Write the micro-batch number on a box if it is at least ~2 characters wide."""
    if event.micro_batch < 0 or event.kind == "core_wait":
        return
    text = str(event.micro_batch)
    box_in = event.duration_ms / end_ms * fig_w * 0.85
    if box_in < 0.07 * (len(text) + 0.5):
        return
    ax.text(event.start_ms + event.duration_ms / 2, y, text, ha="center", va="center",  # type: ignore[attr-defined]
            fontsize=7 if box_in > 0.2 else 6, color="white")
