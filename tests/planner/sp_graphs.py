"""Hypothesis strategy: small random series-parallel op graphs with random per-op costs."""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from tests.planner.factories import make_costs, make_graph


@st.composite
def sp_graphs(draw: st.DrawFn, max_ops: int = 7) -> tuple[OpGraph, CostTable]:
    """x -> a random SP composition of at most `max_ops` ops -> output; costs drawn per op."""
    preds: dict[str, tuple[str, ...]] = {"x": ()}
    budget = [draw(st.integers(2, max_ops))]

    def new_op(srcs: tuple[str, ...]) -> str:
        name = f"op{len(preds)}"
        preds[name] = srcs
        budget[0] -= 1
        return name

    def build(src: str, depth: int) -> str:
        kind = draw(st.sampled_from(("leaf", "series", "parallel"))) if depth < 3 and budget[0] >= 3 else "leaf"
        if kind == "leaf" or budget[0] < 2:
            return new_op((src,))
        if kind == "series":
            return build(build(src, depth + 1), depth + 1)
        ends = [build(src, depth + 1) for _ in range(draw(st.integers(2, 3))) if budget[0] >= 2]
        return new_op(tuple(ends)) if len(ends) > 1 else ends[0] if ends else new_op((src,))

    while budget[0] > 0:
        build(preds and list(preds)[-1], 0)
    assume(len(preds) <= max_ops + 1)  # the inputs placeholder and the ops; `output` comes on top
    graph = make_graph(preds)
    ops = [op.name for op in graph.ops]
    fwd = {op: draw(st.sampled_from((0.5, 1.0, 2.0, 3.0))) for op in ops}
    act = {op: draw(st.sampled_from((1, 2, 4))) << 20 for op in ops}
    params = {op: draw(st.sampled_from((1, 8, 64))) << 20 for op in ops}
    return graph, make_costs(graph, fwd, overhead_ms=draw(st.sampled_from((0.0, 0.5))), act_bytes=act,
                             param_bytes=params)
