"""A layered layout for stage graphs: column = depth, rows ordered to keep edges short.

Columns are the longest path from a source, so parallel branches sit side by side in
one column. Within a column stages are ordered by the mean row of their predecessors
(one barycentre pass, ties by index), which keeps chains of a branch on one row.
"""

from __future__ import annotations

from graphpipe.stages.stage_graph import Plan


def stage_depths(plan: Plan) -> dict[int, int]:
    depth: dict[int, int] = {}
    for stage in plan.stages:
        depth[stage.idx] = 1 + max((depth[p] for p in plan.predecessors[stage.idx]), default=-1)
    return depth


def layered_positions(plan: Plan) -> dict[int, tuple[float, float]]:
    """(column, row) per stage; rows are centred so each column is symmetric about 0."""
    depth = stage_depths(plan)
    columns: dict[int, list[int]] = {}
    for idx in sorted(depth):
        columns.setdefault(depth[idx], []).append(idx)
    row: dict[int, float] = {}
    for col in sorted(columns):
        members = columns[col]
        members.sort(key=lambda s: (_barycentre(plan, s, row), s))
        offset = (len(members) - 1) / 2
        for pos, idx in enumerate(members):
            row[idx] = pos - offset
    return {idx: (float(depth[idx]), row[idx]) for idx in depth}


def _barycentre(plan: Plan, idx: int, row: dict[int, float]) -> float:
    preds = [row[p] for p in plan.predecessors[idx] if p in row]
    return sum(preds) / len(preds) if preds else 0.0
