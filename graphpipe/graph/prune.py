"""Remove checks and dead values from a traced graph, so they never join branches.

Tracing leaves ops that compute nothing the model returns: shape checks (`torch._assert`
in a patch embedding, fx's guards for arguments fixed at their defaults, export's
`_assert_scalar`), and unused reads such as the `N` of `B, N, C = x.shape`. Left in the
graph they read values of several branches and tie them into one block, although no
stage needs them. Mutations are never removed (an in-place op on a buffer is live).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

__all__ = ["prune_graph"]

_CHECK_NAMES = frozenset({"_assert", "_assert_async", "_assert_scalar", "_assert_tensor_metadata", "_assert_is_none",
                          "sym_constrain_range", "sym_constrain_range_for_size", "_check", "_check_is_size"})
_PURE_READS = frozenset({operator.getitem, getattr, len})
_PURE_METHODS = frozenset({"size", "dim", "numel", "stride", "__getitem__"})


def prune_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` without check ops, unused pure reads and the placeholders of defaulted arguments they read."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and _name(node.target) in _CHECK_NAMES:
            graph.erase_node(node)
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if not node.users and _removable(node):
                graph.erase_node(node)
                changed = True
    graph.lint()
    gm.recompile()
    return gm


def _removable(node: torch.fx.Node) -> bool:
    if node.op == "placeholder":
        return bool(node.args)  # an argument traced at its default value (fx concrete_args)
    if node.op == "call_function":
        return node.target in _PURE_READS or _is_pure_aten(node.target) or _name(node.target) in ("eq", "ne")
    if node.op == "call_method":
        return str(node.target) in _PURE_METHODS
    return False


def _is_pure_aten(target: Any) -> bool:
    """An aten overload with no mutable argument and no randomness (sym_size, view, arithmetic, ...)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return not schema.is_mutable and not any(tag.name == "nondeterministic_seeded" for tag in target.tags)


def _name(target: Any) -> str:
    return str(getattr(target, "__name__", target)).split(".")[0]
