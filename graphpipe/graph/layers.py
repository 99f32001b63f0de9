"""Layer granularity: the op graph coarsened along the module hierarchy into *layer blocks*.

A planner's work grows with the number of units it cuts between (`graphpipe.graph.sp.stage_units`):
the DP of the GraphPipe partitioner is quadratic in the items of each chain, Piper enumerates
downsets of units. Cuts inside a transformer layer rarely pay, so at layer granularity each layer
is one more unit, like a colocation group: the planners see a graph of about one unit per layer, and
their plans still list ops (a unit is a set of ops), so the runtime is unchanged.

Which modules are layers. Capture records every op's module stack (`OpNode.module_stack`). A module
instance is a *layer candidate* when

- it repeats: a sibling under the same parent has the same class (`layers.0` .. `layers.31` of a
  ModuleList or Sequential, or two attributes of one class);
- it is composite: some of its ops ran in a submodule (which leaves out a lone `Linear` of a
  Sequential MLP, or transformers' `Conv1D` pairs: their ops are the op level already);
- it holds at least two units.

The blocks are the innermost candidates (none of their submodules is one): the transformer layers
of a stack of branches rather than the branches, BERT's `BertLayer` rather than its encoder. A
candidate that is a *plain stack* (every op ran in a submodule without submodules of its own, and
more than one of them holds weights: an MLP written as a Sequential of Linear and ReLU) is a stack of
layers rather than one: its blocks are its weighted modules, each with the weight-free ones after it
(each Linear and its ReLU of DLRM's and CANDLE-Uno's branch MLPs). That is what a layer is in the
layer graphs of PipeDream and Piper, and it keeps a branch cuttable between its layers: a whole branch
MLP as one unit would forbid the stage boundaries inside a branch that balance a graph pipeline.

When a block is valid. Its units must be a run of consecutive items of one chain of the op-level SP
tree. Such a run is convex (every path between two of its ops stays in it), and contracting it makes
it one leaf of the same tree, so the coarse graph has the same branches and no new merged (non-SP)
core: every planner's search space only shrinks, and each of its plans is a plan of the op graph.
A candidate that is not such a run (a module called twice, a layer sharing a unit with ops outside
it, a module spanning parts of several branches) falls back to its child modules, each tried the
same way, and what is left stays at op level.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, StageUnits, iter_chains, sp_decompose, stage_units
from graphpipe.graph.toposort import priority_topological_order

__all__ = ["LayerBlock", "coarsen_units", "layer_blocks", "layer_units"]

Scope = tuple[str, str]  # (qualified module name, class)


@dataclass(frozen=True, slots=True)
class LayerBlock:
    """One module instance kept whole: the op-level units it joins (`keys`, topological order) and
    all their ops (`ops`, riders included, graph order)."""

    path: str
    module_type: str
    keys: tuple[str, ...]
    ops: tuple[str, ...]


def layer_units(graph: OpGraph, opened: Collection[str] = ()) -> StageUnits:
    """The units of layer granularity: op-level units with every layer block (but those whose path is in
    `opened`, which stay at op level) contracted into one."""
    units = stage_units(graph)
    blocks = [block for block in layer_blocks(graph, units) if block.path not in opened]
    return coarsen_units(graph, units, blocks)


def layer_blocks(graph: OpGraph, units: StageUnits | None = None,
                 tree: SPChain | None = None) -> tuple[LayerBlock, ...]:
    """The valid layer blocks of `graph` (module docstring), in topological order of their first unit.
    `units` and `tree` are the op-level units and SP tree, when the caller has them already."""
    units = units if units is not None else stage_units(graph)
    tree = tree if tree is not None else sp_decompose(graph, units)
    members: dict[str, list[int]] = {}  # module -> the units it holds whole
    for idx, scope in enumerate(_unit_scopes(graph, units)):
        for path, _ in scope:
            members.setdefault(path, []).append(idx)
    types, children = _module_tree(graph)
    candidates = {path for path in _repeated(types) if len(members.get(path, ())) >= 2 and children.get(path)}
    outer = {path.rsplit(".", pos)[0] for path in candidates for pos in range(1, path.count(".") + 1)}
    unit_of = {op: idx for idx, ops in enumerate(units.ops) for op in ops}
    innermost = sorted(candidates - outer)
    stacks = {path: layers for path in innermost
              if (layers := _stack_layers(graph, units, path, members[path], children)) is not None}
    chosen = _valid_or_children([path for path in innermost if path not in stacks], tree, unit_of, members,
                                children)
    stacked = {name: ids for layers in stacks.values() for name, ids in layers.items() if len(ids) >= 2}
    members.update(stacked)
    chosen += sorted(_aligned_runs(tree, unit_of, stacked))
    position = {key: idx for idx, key in enumerate(units.keys)}
    blocks = [_block(graph, units, path, types[path], members[path]) for path in chosen]
    return tuple(sorted(blocks, key=lambda block: position[block.keys[0]]))


def _valid_or_children(todo: list[str], tree: SPChain, unit_of: Mapping[str, int],
                       members: Mapping[str, list[int]], children: Mapping[str, set[str]]) -> list[str]:
    """The modules of `todo` that are runs of one SP chain; in place of each other one, its submodules of
    at least two units, tried the same way, level by level (they are disjoint, so one pass over the tree
    checks a whole level)."""
    chosen: list[str] = []
    while todo:
        aligned = _aligned_runs(tree, unit_of, {path: members[path] for path in todo})
        chosen += [path for path in todo if path in aligned]
        todo = sorted(child for path in todo if path not in aligned for child in children.get(path, ())
                      if len(members.get(child, ())) >= 2)
    return chosen


def _stack_layers(graph: OpGraph, units: StageUnits, path: str, ids: Sequence[int],
                  children: Mapping[str, set[str]]) -> dict[str, list[int]] | None:
    """The layers of a plain stack, or None if `path` is not one. A plain stack (an MLP written as a
    Sequential of Linear and activation modules) runs every op in a child module that has no submodules,
    and more than one child holds weights. Its layers are its weighted children, each with the units of the
    weight-free children after it (a Linear with its ReLU), named by the weighted child."""
    child_of: dict[int, str] = {}
    for idx in ids:
        paths = [[scope for scope, _ in graph.op(op).module_stack] for op in units.ops[idx]
                 if not graph.op(op).replicated]
        inside = {stack[stack.index(path) + 1] if stack[-1] != path else None for stack in paths}
        if len(inside) != 1 or None in inside:
            return None  # ops of the module's own forward, or a unit spanning two children
        child_of[idx] = str(inside.pop())
    if any(children.get(child) for child in child_of.values()):
        return None
    weighted = {child_of[idx] for idx in ids if any(graph.op(op).params for op in units.ops[idx])}
    if len(weighted) < 2:
        return None
    layers: dict[str, list[int]] = {}
    current: str | None = None
    for idx in sorted(ids):
        if child_of[idx] in weighted:
            current = child_of[idx]
        layers.setdefault(current or child_of[idx], []).append(idx)
    return layers


def layer_unit_count(units: StageUnits, blocks: Sequence[LayerBlock]) -> int:
    """How many units the planners cut between with `blocks` contracted (`coarsen_units`), without building them."""
    return len(units.keys) - sum(len(block.keys) - 1 for block in blocks)


def coarsen_units(graph: OpGraph, units: StageUnits, blocks: Sequence[LayerBlock]) -> StageUnits:
    """`units` with each block's units contracted into one, named by its first key. Blocks are valid
    (`layer_blocks`), so the contracted graph is acyclic."""
    if not blocks:
        return units
    head = {key: block.keys[0] for block in blocks for key in block.keys}
    ops: dict[str, list[str]] = {}
    preds: dict[str, dict[str, None]] = {}
    for key, unit_ops in zip(units.keys, units.ops):
        mine = head.get(key, key)
        ops.setdefault(mine, []).extend(unit_ops)
        into = preds.setdefault(mine, {})
        into.update((head.get(src, src), None) for src in units.preds[key] if head.get(src, src) != mine)
    names = list(ops)
    order = priority_topological_order(names, [(src, name) for name in names for src in preds[name]], graph.index)
    assert len(order) == len(names), "layer blocks must be convex"
    return StageUnits(keys=tuple(order), ops=tuple(tuple(sorted(ops[key], key=graph.index)) for key in order),
                      preds={key: tuple(preds[key]) for key in order})


def _unit_scopes(graph: OpGraph, units: StageUnits) -> list[tuple[Scope, ...]]:
    """Per unit, the modules all its computing ops ran in (the common prefix of their stacks): a unit
    belongs to a module only as a whole. Riders (replicated ops) do not count: they go where their
    reader goes."""
    scopes = []
    for key, ops in zip(units.keys, units.ops):
        own = [op for op in ops if not graph.op(op).replicated] or [key]
        stacks = [graph.op(op).module_stack for op in own]
        common = stacks[0]
        for stack in stacks[1:]:
            size = 0
            while size < min(len(common), len(stack)) and common[size] == stack[size]:
                size += 1
            common = common[:size]
        scopes.append(common)
    return scopes


def _module_tree(graph: OpGraph) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Class of every module some op ran in, and each one's submodules that ran ops (from the stacks)."""
    types: dict[str, str] = {}
    children: dict[str, set[str]] = {}
    for op in graph.ops:
        types.update(op.module_stack)
        for (parent, _), (child, _) in zip(op.module_stack, op.module_stack[1:]):
            children.setdefault(parent, set()).add(child)
    return types, children


def _repeated(types: Mapping[str, str]) -> set[str]:
    """Modules with a sibling of the same class: same parent path, same class."""
    def key(path: str) -> tuple[str, str]:
        return path.rpartition(".")[0], types[path]

    counts = Counter(key(path) for path in types)
    return {path for path in types if counts[key(path)] > 1}


def _aligned_runs(tree: SPChain, unit_of: Mapping[str, int], members: Mapping[str, Sequence[int]]) -> set[str]:
    """The modules (disjoint sets of units) whose units are exactly a run of consecutive items of one chain."""
    owner = {unit: path for path, ids in members.items() for unit in ids}
    aligned: set[str] = set()
    for chain in iter_chains(tree):
        current, count = None, 0
        for item in chain.items:
            here = {unit_of[op] for op in item.ops}
            owners = {owner.get(unit) for unit in here}
            path = owners.pop() if len(owners) == 1 else None
            if path is None:
                current, count = None, 0
                continue
            count = count + len(here) if path == current else len(here)
            current = path
            if count == len(members[path]):
                aligned.add(path)
    return aligned


def _block(graph: OpGraph, units: StageUnits, path: str, module_type: str, ids: Sequence[int]) -> LayerBlock:
    ordered = sorted(ids)
    ops = sorted((op for idx in ordered for op in units.ops[idx]), key=graph.index)
    return LayerBlock(path=path, module_type=module_type, keys=tuple(units.keys[idx] for idx in ordered),
                      ops=tuple(ops))
