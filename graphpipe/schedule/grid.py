"""The stage × step grid of a schedule, as text: how docstrings draw schedules and errors show them."""

from __future__ import annotations

from collections.abc import Mapping

from graphpipe.schedule.action import Action
from graphpipe.schedule.schedule import Schedule


def format_grid(schedule: Schedule, *, compute_only: bool = False, marks: Mapping[int, int] | None = None,
                window: int | None = None) -> str:
    """One row per stage, one column per step; cells are actions without the stage prefix.

    `marks` maps stage -> step index of an action to flag with `*`; `window` keeps only the
    columns within that many steps of the earliest mark (long schedules stay readable).
    """
    rows = {s: _cells(schedule.actions[s], compute_only) for s in schedule.stages}
    marks = dict(marks or {})
    for stage, step in marks.items():
        if stage in rows and step < len(rows[stage]):
            rows[stage][step] = "*" + rows[stage][step] + "*"
    width = max((len(cells) for cells in rows.values()), default=0)
    lo, hi = 0, width
    if window is not None and marks:
        centre = min(marks.values())
        lo, hi = max(0, centre - window), min(width, centre + window + 1)
    cols = range(lo, hi)
    cell_w = max([len(str(c)) for c in cols] + [len(c) for cells in rows.values() for c in cells[lo:hi]] + [1])
    label_w = max([len("stage")] + [len(f"s{s}") for s in rows])
    lines = [f"{'stage':<{label_w}} | " + "  ".join(f"{c:<{cell_w}}" for c in cols).rstrip()]
    lines.append("-" * (label_w + 1) + "+" + "-" * (len(lines[0]) - label_w - 1))
    for stage, cells in rows.items():
        shown = [cells[c] if c < len(cells) else "" for c in cols]
        lines.append(f"{f's{stage}':<{label_w}} | " + "  ".join(f"{c:<{cell_w}}" for c in shown).rstrip())
    return "\n".join(lines)


def _cells(actions: tuple[Action, ...], compute_only: bool) -> list[str]:
    picked = [a for a in actions if a.kind.is_compute] if compute_only else list(actions)
    return [str(a).split(".", 1)[1] for a in picked]
