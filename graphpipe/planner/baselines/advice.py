"""What a baseline that gave up on a graph's size suggests: a coarser granularity if there is one."""

from __future__ import annotations


def smaller_graph_advice(granularity: str) -> str:
    """The fix for a search space too large: at op level, whole layers; already at layer level (or "auto"),
    only the GraphPipe planner, whose work grows with the branches' lengths rather than their product."""
    if granularity == "op":
        return "plan at layer granularity (--granularity layer) or use planner 'graphpipe'"
    return "use planner 'graphpipe', whose search grows with the branches' lengths, not their product"
