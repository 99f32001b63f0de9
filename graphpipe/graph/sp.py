"""Series-parallel (SP) decomposition of an op graph: the structure the partitioner's DP walks.

The result is a tree of three kinds of nodes over ops:

- `SPLeaf`: one op, or several ops merged into one indivisible unit (see below);
- `SPChain`: items run one after the other; every exit op of item i feeds every entry op
  of item i + 1 (in the SP skeleton);
- `SPParallel`: independent branches (chains) between the item before it in the enclosing
  chain (the fork) and the item after it (the join); `has_bypass` records a direct
  fork -> join edge (a residual connection: an empty branch).

How it is built. Each op v becomes an edge v_in -> v_out and each data edge u -> v a
wire u_out -> v_in; several graph inputs get a virtual source junction, several sinks a
virtual sink junction (junctions, not ops: nothing is added to the model). The two-terminal
graph is then reduced with the classic series (a junction with one edge in and one out)
and parallel (two edges between the same junctions) reductions, each O(1), with a work
list: near-linear in the number of edges.

Graphs that are not SP are made SP without changing what the model computes:

1. Transitive edges are dropped from the skeleton first (u -> w when another path
   u -> ... -> w exists). This is exact for planning: reachability, hence stage convexity
   and the in-flight rule, are unchanged, and communication is always costed on the real
   edges. This alone makes e.g. DLRM's "bottom MLP feeds both the interaction and the
   concat" SP.
2. If reductions still get stuck (a true non-SP core such as x->a, x->b, a->c, a->d,
   b->d, c,d->out), the smallest single-entry single-exit region around a stuck fork
   (the fork and its immediate post-dominator) is merged into one `SPLeaf` holding all its
   ops: those ops will always share a stage. The whole graph is the region of last resort,
   so the method always terminates. When a branch that reads only model inputs joins deep
   inside another branch (a tower's aspect-ratio embedding added after its layers), that
   branch shares a leaf with the op that reads it instead, if that is fewer ops: the closed
   region around it would hold the whole tower and keep it from running beside the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from graphpipe.graph.colocation import colocation_groups
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.toposort import priority_topological_order


@dataclass(frozen=True, slots=True)
class SPLeaf:
    """One op, or several ops merged to make the graph SP (they always share a stage)."""

    ops: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class SPParallel:
    """Branches between a fork and a join; `has_bypass` when the fork also feeds the join directly."""

    branches: tuple[SPChain, ...]
    has_bypass: bool = False

    @cached_property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for branch in self.branches for op in branch.ops)


@dataclass(frozen=True, eq=False)
class SPChain:
    """Items in series."""

    items: tuple[SPLeaf | SPParallel, ...]

    @cached_property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for item in self.items for op in item.ops)


SPItem = SPLeaf | SPParallel


def iter_chains(chain: SPChain) -> Iterator[SPChain]:
    """Every chain of the tree, outermost first."""
    stack = [chain]
    while stack:
        current = stack.pop()
        yield current
        for item in current.items:
            if isinstance(item, SPParallel):
                stack.extend(item.branches)


def iter_parallels(chain: SPChain) -> Iterator[SPParallel]:
    for current in iter_chains(chain):
        yield from (item for item in current.items if isinstance(item, SPParallel))


def merged_leaves(chain: SPChain) -> tuple[SPLeaf, ...]:
    """Leaves holding several ops: where the graph had to be merged to become SP."""
    return tuple(item for c in iter_chains(chain) for item in c.items
                 if isinstance(item, SPLeaf) and len(item.ops) > 1)


def sp_decompose(graph: OpGraph, units: StageUnits | None = None) -> SPChain:
    """The SP tree of an op graph (ops of the tree = ops of the graph, each exactly once).

    Only data edges shape the tree, between *units* (`stage_units`): replicated ops (model
    inputs, parameter reads, shape arithmetic, masks: `graphpipe.graph.replication`) are
    computed by every stage that reads them, so they join no branches and ride in the unit of
    their first reader; ops that must share a stage (`graphpipe.graph.colocation`) are one unit.
    """
    units = units if units is not None else stage_units(graph)
    tree = decompose_dag(units.keys, units.preds)
    extra = {key: [op for op in ops if op != key] for key, ops in zip(units.keys, units.ops) if len(ops) > 1}
    if not extra:
        return tree
    return _with_riders(tree, extra, {name: idx for idx, name in enumerate(graph.names)})


@dataclass(frozen=True, slots=True)
class StageUnits:
    """The graph contracted to what the planners cut between: units in topological order.

    `keys[i]` names unit i by one of its ops, `ops[i]` holds all of them (graph order), and
    `preds[key]` are the keys of the units it reads along data edges.
    """

    keys: tuple[str, ...]
    ops: tuple[tuple[str, ...], ...]
    preds: Mapping[str, tuple[str, ...]]


def stage_units(graph: OpGraph) -> StageUnits:
    """Every op in exactly one unit; a stage is a union of units (what `sp_decompose` and the chain
    planners see). Replicated and dead ops ride with their reader or producer; a colocation group is
    one unit."""
    groups = colocation_groups(graph)
    rep_of = {member: group[0] for group in groups for member in group}
    members = {group[0]: group for group in groups}
    riders = _riders(graph)
    riders.update((op, host) for op, host in _dead(graph).items() if op not in rep_of)
    names = [op.name for op in graph.ops if op.name not in riders and rep_of.get(op.name, op.name) == op.name]
    preds: dict[str, tuple[str, ...]] = {}
    for name in names:
        sources = (rep_of.get(src, src) for member in members.get(name, (name,))
                   for src in graph.data_predecessors(member) if src not in riders)
        preds[name] = tuple(dict.fromkeys(src for src in sources if src != name))
    ops: dict[str, list[str]] = {name: list(members.get(name, (name,))) for name in names}
    for rider in riders:
        host = _final_host(rider, riders)
        ops[rep_of.get(host, host)].append(rider)
    order = priority_topological_order(names, [(src, name) for name in names for src in preds[name]], graph.index)
    assert len(order) == len(names), "colocation groups must be convex"
    return StageUnits(keys=tuple(order), ops=tuple(tuple(sorted(ops[key], key=graph.index)) for key in order),
                      preds=preds)


def _final_host(op: str, riders: Mapping[str, str]) -> str:
    while op in riders:
        op = riders[op]
    return op


def _dead(graph: OpGraph) -> dict[str, str]:
    """Ops the output does not depend on (a graph made by hand; capture removes them), each mapped to its
    latest producer, so that they ride along and join no branch."""
    live = {graph.output}
    for op in reversed(graph.ops):
        if op.name in live:
            live.update(op.inputs)
    dead = {}
    for op in graph.ops:
        if op.name not in live and not op.replicated:
            producers = graph.data_predecessors(op.name)
            dead[op.name] = max(producers, key=graph.index) if producers else graph.output
    return dead


def _riders(graph: OpGraph) -> dict[str, str]:
    """Replicated ops mapped to the first op that reads them and is not replicated (the output if none)."""
    host: dict[str, str] = {}
    for op in reversed(graph.ops):
        if not op.replicated:
            continue
        readers = [reader if not graph.op(reader).replicated else host[reader] for reader in graph.successors(op.name)]
        host[op.name] = min(readers, key=graph.index) if readers else graph.output
    return host


def _with_riders(chain: SPChain, by_reader: Mapping[str, Sequence[str]], order: Mapping[str, int]) -> SPChain:
    items: list[SPItem] = []
    for item in chain.items:
        if isinstance(item, SPParallel):
            branches = tuple(_with_riders(branch, by_reader, order) for branch in item.branches)
            items.append(SPParallel(branches=branches, has_bypass=item.has_bypass))
        else:
            extra = [rider for op in item.ops for rider in by_reader.get(op, ())]
            items.append(SPLeaf(ops=tuple(sorted(item.ops + tuple(extra), key=order.__getitem__))) if extra else item)
    return SPChain(items=tuple(items))


def decompose_dag(names: Sequence[str], preds: Mapping[str, Sequence[str]]) -> SPChain:
    """SP tree of a DAG given as names in topological order and their predecessors."""
    order = {name: idx for idx, name in enumerate(names)}
    skeleton = _transitive_reduction(names, preds)
    reducer = _Reducer(names, skeleton)
    tree = reducer.run()
    items = _to_items(tree, order)
    return SPChain(items=items)


# ---- transitive reduction ---------------------------------------------------------------
def _transitive_reduction(names: Sequence[str], preds: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """Predecessors without transitive edges (bitsets over topological positions)."""
    pos = {name: idx for idx, name in enumerate(names)}
    succs: dict[str, list[str]] = {name: [] for name in names}
    for name in names:
        for src in dict.fromkeys(preds[name]):
            succs[src].append(name)
    reach: dict[str, int] = {}
    kept: dict[str, list[str]] = {name: [] for name in names}
    for name in reversed(names):
        targets = sorted(succs[name], key=pos.__getitem__)
        via_others = 0
        for tgt in targets:
            via_others |= reach[tgt] & ~(1 << pos[tgt])
        mine = 0
        for tgt in targets:
            if not via_others >> pos[tgt] & 1:
                kept[tgt].append(name)
            mine |= reach[tgt]
        reach[name] = mine | (1 << pos[name])
    return {name: tuple(kept[name]) for name in names}


# ---- reduction of the two-terminal edge graph --------------------------------------------
# Trees during reduction: ("op", name) | ("wire",) | ("blob", names) | ("ser", first, second) | ("par", *children);
# a series node never holds a wire, and may hold series nodes (`_ser`)
_Tree = tuple[Any, ...]
_Node = tuple[str, ...]  # ("in", op) | ("out", op) | ("src",) | ("snk",)

_SOURCE, _SINK = ("src",), ("snk",)


def _ser(first: _Tree, second: _Tree) -> _Tree:
    """`first` then `second` as one node, without copying either: a long chain is joined one edge at a time,
    and flattening at each join made the reduction quadratic in its length (`_series_parts` flattens once)."""
    if first[0] == "wire":
        return second
    if second[0] == "wire":
        return first
    return ("ser", first, second)


def _series_parts(tree: _Tree) -> list[_Tree]:
    """The parts of a series node in order, nested series flattened (iteratively: a chain nests as deep as it
    is long)."""
    parts: list[_Tree] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if node[0] == "ser":
            stack.extend(reversed(node[1:]))
        else:
            parts.append(node)
    return parts


def _par(first: _Tree, second: _Tree) -> _Tree:
    parts = [part for tree in (first, second) for part in (tree[1:] if tree[0] == "par" else (tree,))]
    return ("par", *parts)


class _Reducer:
    """Series/parallel reductions on a multigraph of junctions, with merging when stuck."""

    def __init__(self, names: Sequence[str], skeleton: Mapping[str, Sequence[str]]) -> None:
        self.out: dict[_Node, dict[_Node, _Tree]] = {}
        self.inn: dict[_Node, dict[_Node, _Tree]] = {}
        has_succ = {src for name in names for src in skeleton[name]}
        for name in names:
            self._add(("in", name), ("out", name), ("op", name))
            for src in skeleton[name]:
                self._add(("out", src), ("in", name), ("wire",))
            if not skeleton[name]:
                self._add(_SOURCE, ("in", name), ("wire",))
            if name not in has_succ:
                self._add(("out", name), _SINK, ("wire",))

    def _node(self, node: _Node) -> None:
        self.out.setdefault(node, {})
        self.inn.setdefault(node, {})

    def _add(self, src: _Node, dst: _Node, tree: _Tree) -> None:
        self._node(src)
        self._node(dst)
        old = self.out[src].get(dst)
        merged = tree if old is None else _par(old, tree)
        self.out[src][dst] = merged
        self.inn[dst][src] = merged

    def _remove(self, src: _Node, dst: _Node) -> _Tree:
        tree = self.out[src].pop(dst)
        del self.inn[dst][src]
        return tree

    def _reduce(self, work: list[_Node]) -> None:
        while work:
            node = work.pop()
            if node in (_SOURCE, _SINK) or node not in self.out:
                continue
            if len(self.inn[node]) != 1 or len(self.out[node]) != 1:
                continue
            (src,) = self.inn[node]
            (dst,) = self.out[node]
            tree = _ser(self._remove(src, node), self._remove(node, dst))
            del self.out[node], self.inn[node]
            self._add(src, dst, tree)
            work.extend((src, dst))

    def run(self) -> _Tree:
        self._reduce(list(self.out))
        while not (len(self.out) == 2 and len(self.out[_SOURCE]) == 1 and _SINK in self.out[_SOURCE]):
            src, dst, region = self._stuck_region()
            ops = tuple(name for tree in region for name in _ops_of(tree))
            branch = self._smallest_input_branch()
            if branch is not None and ((src, dst) == (_SOURCE, _SINK) or branch[1] < len(ops)):
                self._fold_input_branch(branch[0])
                continue
            for a, b in list(self._region_edges(src, dst)):
                self._remove(a, b)
            for node in list(self.out):
                if node not in (src, dst, _SOURCE, _SINK) and not self.out[node] and not self.inn[node]:
                    del self.out[node], self.inn[node]
            self._add(src, dst, ("blob", ops) if ops else ("wire",))
            self._reduce([src, dst])
        return self.out[_SOURCE][_SINK]

    # ---- folding a branch that reads only model inputs into its reader ---------------------
    def _smallest_input_branch(self) -> tuple[_Node, int] | None:
        """The join fed straight from the source whose input-only branch, with the op that reads it, is the
        fewest ops; None if no join is fed so. Such a branch (a position or aspect-ratio embedding added deep
        inside a tower) depends on nothing the rest computes, so sharing its reader's stage costs the planner
        only that branch, where merging the smallest closed region around it could swallow a whole tower."""
        best: tuple[_Node, int] | None = None
        for join, branch in self.out[_SOURCE].items():
            if join[0] != "in" or len(self.inn[join]) < 2 or len(self.out[join]) != 1:
                continue
            (onward,) = self.out[join].values()
            size = sum(1 for _ in _ops_of(branch)) + sum(1 for _ in _ops_of(_series_parts(onward)[0]))
            if best is None or size < best[1]:
                best = (join, size)
        return best

    def _fold_input_branch(self, join: _Node) -> None:
        """Move the source's branch into `join` into one leaf with the op that reads it: one edge fewer."""
        branch = self._remove(_SOURCE, join)
        (after,) = self.out[join]
        head, *rest = _series_parts(self._remove(join, after))
        tree: _Tree = ("blob", (*_ops_of(branch), *_ops_of(head)))
        for part in rest:
            tree = _ser(tree, part)
        self._add(join, after, tree)
        self._reduce([join, after, _SOURCE])

    # ---- merging a stuck region ----------------------------------------------------------
    def _topo(self) -> list[_Node]:
        indeg = {node: len(self.inn[node]) for node in self.out}
        ready = [node for node, deg in indeg.items() if deg == 0]
        order: list[_Node] = []
        while ready:
            node = ready.pop()
            order.append(node)
            for nxt in self.out[node]:
                indeg[nxt] -= 1
                if indeg[nxt] == 0:
                    ready.append(nxt)
        return order

    def _ipdom(self, order: list[_Node]) -> dict[_Node, _Node]:
        """Immediate post-dominators (iterative, on the reversed graph)."""
        rank = {node: idx for idx, node in enumerate(reversed(order))}  # sink first
        ipdom: dict[_Node, _Node] = {_SINK: _SINK}

        def meet(a: _Node, b: _Node) -> _Node:
            while a != b:
                while rank[a] > rank[b]:
                    a = ipdom[a]
                while rank[b] > rank[a]:
                    b = ipdom[b]
            return a

        changed = True
        while changed:
            changed = False
            for node in reversed(order):
                if node == _SINK:
                    continue
                done = [s for s in self.out[node] if s in ipdom]
                if not done:
                    continue
                new = done[0]
                for succ in done[1:]:
                    new = meet(new, succ)
                if ipdom.get(node) != new:
                    ipdom[node] = new
                    changed = True
        return ipdom

    def _region_edges(self, src: _Node, dst: _Node) -> Iterator[tuple[_Node, _Node]]:
        seen = {src}
        stack = [src]
        while stack:
            node = stack.pop()
            if node == dst:
                continue
            for nxt in self.out[node]:
                yield node, nxt
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)

    def _closed(self, src: _Node, dst: _Node) -> bool:
        edges = list(self._region_edges(src, dst))
        interior = {b for _, b in edges} - {dst}
        return all(pred in interior or pred == src for node in interior for pred in self.inn[node])

    def _stuck_region(self) -> tuple[_Node, _Node, list[_Tree]]:
        order = self._topo()
        ipdom = self._ipdom(order)
        best: tuple[int, _Node, _Node] | None = None
        for node in order:
            if node == _SINK or len(self.out[node]) < 2:
                continue
            dst = ipdom[node]
            if not self._closed(node, dst):
                continue
            size = sum(1 for _ in self._region_edges(node, dst))
            if best is None or size < best[0]:
                best = (size, node, dst)
        src, dst = (_SOURCE, _SINK) if best is None else best[1:]
        region = [self.out[a][b] for a, b in self._region_edges(src, dst)]
        return src, dst, region


def _ops_of(tree: _Tree) -> Iterator[str]:
    kind = tree[0]
    if kind == "op":
        yield tree[1]
    elif kind == "blob":
        yield from tree[1]
    elif kind == "ser":
        for part in _series_parts(tree):
            yield from _ops_of(part)
    elif kind == "par":
        for child in tree[1:]:
            yield from _ops_of(child)


# ---- conversion to the op-level tree --------------------------------------------------------
def _to_items(tree: _Tree, order: Mapping[str, int]) -> tuple[SPItem, ...]:
    kind = tree[0]
    if kind == "wire":
        return ()
    if kind == "op":
        return (SPLeaf(ops=(tree[1],)),)
    if kind == "blob":
        return (SPLeaf(ops=tuple(sorted(tree[1], key=order.__getitem__))),)
    if kind == "ser":
        return tuple(item for part in _series_parts(tree) for item in _to_items(part, order))
    branches = [_to_items(child, order) for child in tree[1:]]
    nonempty = [SPChain(items=items) for items in branches if items]
    bypass = len(nonempty) < len(branches)
    if not nonempty:
        return ()
    if len(nonempty) == 1 and not bypass:
        return nonempty[0].items
    nonempty.sort(key=lambda chain: order[chain.ops[0]])
    return (SPParallel(branches=tuple(nonempty), has_bypass=bypass),)
