"""A picture of a plan's stage graph: stages as boxes laid out by depth, edges labelled with bytes.

Each box shows the stage, its ranks, micro-batch size and in-flight samples, and a
summary of its ops (op kinds when the op graph is given, else the first and last op
names); a recomputing stage (`Stage.recompute`) has a dashed border and says so. Edge
labels are the activation bytes of one micro-batch of the sending stage. PNG or SVG, chosen by the file suffix.
"""

from __future__ import annotations

import os
from collections import Counter

from graphpipe.graph.op_graph import OpGraph
from graphpipe.simulation.layout import layered_positions
from graphpipe.stages.stage_graph import Plan, Stage
from graphpipe.units import format_bytes

BOX_W, BOX_H = 0.64, 0.72  # in column / row units
COL_IN, ROW_IN = 3.6, 1.35  # inches per column / row
MAX_WIDTH_IN = 48.0  # deep chains shrink their columns (and fonts) to stay within this


def render_stage_graph(plan: Plan, path: str | os.PathLike[str], *, graph: OpGraph | None = None) -> str:
    """Draw `plan`'s stage graph to `path` (PNG or SVG by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path as MplPath

    pos = layered_positions(plan)
    num_cols = int(max(x for x, _ in pos.values())) + 1
    num_rows = max(sum(1 for x2, _ in pos.values() if x2 == x) for x, _ in pos.values())
    col_in = min(COL_IN, MAX_WIDTH_IN / num_cols)
    font = 7.5 * col_in / COL_IN
    fig, ax = plt.subplots(figsize=(1.0 + col_in * num_cols, 1.4 + ROW_IN * num_rows))
    top = -num_rows / 2
    num_skips = 0
    for edge in plan.edges:
        (x0, y0), (x1, y1) = pos[edge.src], pos[edge.dst]
        label = format_bytes(edge.bytes_per_sample * plan.stages[edge.src].micro_batch_size)
        if x1 - x0 > 1:  # jumps over a column: route it on a lane above every box
            num_skips += 1
            lane = top - 0.12 * num_skips
            points = [(x0 + BOX_W / 2, y0), (x0 + 0.5, lane), (x1 - 0.5, lane), (x1 - BOX_W / 2, y1)]
            label_x, label_y = (x0 + x1) / 2, lane
        else:
            points = [(x0 + BOX_W / 2, y0), (x1 - BOX_W / 2, y1)]
            label_x, label_y = (x0 + x1) / 2, (y0 + y1) / 2
        ax.add_patch(FancyArrowPatch(path=MplPath(points), arrowstyle="-|>", mutation_scale=12,
                                     color="#555555", linewidth=1.0))
        ax.text(label_x, label_y, label, fontsize=font * 0.93, ha="center", va="center",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    for stage in plan.stages:
        x, y = pos[stage.idx]
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0.02",
                                    fc=_colour(stage, plan), ec="#333333", linewidth=1.6 if stage.recompute else 1.0,
                                    linestyle="--" if stage.recompute else "-"))
        ax.text(x, y, _box_text(stage, graph), ha="center", va="center", fontsize=font, family="monospace")
    ax.set_xlim(-0.6, num_cols - 0.4)
    ax.set_ylim(num_rows / 2 + 0.1, top - 0.12 * num_skips - 0.15)
    ax.axis("off")
    ax.set_title(f"{plan.graph_name}: {plan.planner} plan, {plan.num_stages} stages, depth {plan.depth}, "
                 f"{plan.world_size} devices, mini-batch {plan.global_batch_size}\n"
                 "edge labels: activation bytes per micro-batch"
                 + ("; dashed: recomputes its forward in its backward" if plan.recompute_stages else ""),
                 fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _box_text(stage: Stage, graph: OpGraph | None) -> str:
    lines = [f"s{stage.idx} · {_ranks(stage.ranks)} · b={stage.micro_batch_size}",
             f"{len(stage.ops)} ops: {_op_names(stage)}"]
    kinds = _op_kinds(stage, graph)
    if kinds:
        lines.append(kinds)
    lines.append(f"in-flight {stage.in_flight_samples} samples")
    if stage.memory_bytes:
        lines[-1] += f" · {format_bytes(stage.memory_bytes)}"
    if stage.recompute:
        lines.append("recompute: inputs kept")
    return "\n".join(lines)


def _op_names(stage: Stage) -> str:
    if len(stage.ops) == 1:
        return _short(stage.ops[0], 26)
    return f"{_short(stage.ops[0], 12)}…{_short(stage.ops[-1], 12)}"


def _op_kinds(stage: Stage, graph: OpGraph | None) -> str:
    """The most common module types of the stage (functions only when it has no modules)."""
    if graph is None or not all(op in graph for op in stage.ops):
        return ""
    nodes = [graph.op(op) for op in stage.ops]
    modules = [n for n in nodes if n.kind == "call_module"] or [n for n in nodes if n.kind != "placeholder"]
    kinds = Counter(n.module_type or n.target for n in modules)
    return ", ".join(f"{kind}×{n}" if n > 1 else kind for kind, n in kinds.most_common(2))[:36]


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def _colour(stage: Stage, plan: Plan) -> str:
    """Sources, sinks and the rest in three soft colours."""
    if not plan.predecessors[stage.idx]:
        return "#DCE9F5"
    if not plan.successors[stage.idx]:
        return "#F9E0CC"
    return "#E8F2E1"
