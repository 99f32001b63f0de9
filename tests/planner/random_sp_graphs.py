"""Random series-parallel op graphs whose SP tree is known by construction: the references' test data.

A case is drawn as a tree of chains and parallel blocks, then emitted as ops in depth-first
order (so the op graph's order is topological and a block's branches are in the order of their
first op). The tree it returns is the one a series-parallel decomposition of the graph must
find, which is why the generator keeps it canonical:

- every leaf is one op; the model input `x` rides in the leaf of its first reader (inputs are
  replicated: they carry no message and join no branches);
- a block has at least two branches, and a branch is never a lone block (its branches would
  hang between the same two junctions as its siblings: one wider block);
- no two blocks are adjacent in a chain (every exit of one feeding every entry of the next is
  not series-parallel), so a block is followed by its join leaf or ends its chain;
- the top chain ends with the `output` op, which reads every sink.

Extra edges that skip an item (a leaf also reading the leaf two items back, a join also reading
its block's fork) are transitive: they cost communication but change neither the tree nor
reachability, hence neither convexity nor in-flight counts.

Costs are linear in the batch (`fwd = overhead + slope x batch`), stored at every integer size up
to the largest micro-batch, so a data-parallel share b / d (an integer: d divides b) is read as
stored, never interpolated. Times are multiples of 1/16 ms and sizes whole bytes, so sums are
exact and equal branch weights tie the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import assume
from hypothesis import strategies as st

from graphpipe.cost.cluster import Cluster, Device, Link
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef
from graphpipe.graph.tensor_meta import TensorMeta

MiB = 2**20
SHAPES = ("chain", "fork_join", "two_branch", "nested", "wide5", "wide6", "wide7", "wide8")
MIN_OPS = 4  # computing ops: with fewer, every planner has little to choose


@dataclass(frozen=True, eq=False)
class Leaf:
    ops: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Block:
    branches: tuple[Chain, ...]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for branch in self.branches for op in branch.ops)


@dataclass(frozen=True, eq=False)
class Chain:
    items: tuple[Leaf | Block, ...]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for item in self.items for op in item.ops)


@dataclass(frozen=True, eq=False)
class Case:
    """One planning problem: the graph with its known SP tree, costs, cluster, batch and memory limit."""

    shape: str
    graph: OpGraph
    tree: Chain
    costs: CostTable
    cluster: Cluster
    global_batch_size: int
    micro_batch_size: int
    tightness: float  # a tight memory limit is this fraction of the peak of the plan under no limit

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    @property
    def computing_ops(self) -> int:
        return sum(1 for op in self.graph.ops if op.kind == "call_function")

    def widest_block(self) -> int:
        return _widest(self.tree)

    def describe(self) -> str:
        """Everything needed to rebuild the case by hand (a reproducer): costs are linear in the batch, so
        their rows at batch 1 and at the micro-batch size give the whole table."""
        preds = {op.name: op.inputs for op in self.graph.ops}
        rows = {size: {op: (per[size].fwd_ms, per[size].bwd_ms, per[size].act_bytes, per[size].output_bytes,
                            per[size].param_bytes) for op, per in self.costs.entries.items()}
                for size in sorted({1, self.micro_batch_size})}
        return (f"shape={self.shape} preds={preds}\ncosts per batch size, per op (fwd, bwd, act, out, params)={rows}\n"
                f"devices={self.num_devices} per_node={self.cluster.devices_per_node} "
                f"intra={self.cluster.intra_node} inter={self.cluster.inter_node}\n"
                f"B={self.global_batch_size} b={self.micro_batch_size}")


def _widest(chain: Chain) -> int:
    found = 0
    for item in chain.items:
        if isinstance(item, Block):
            found = max(found, len(item.branches), *(_widest(branch) for branch in item.branches))
    return found


# ---- structure --------------------------------------------------------------------------------
Spec = list  # a chain: a list of items, each "L" (one op) or a list of branch chains (a block)


def _branch(draw: st.DrawFn, depth: int, budget: list[int], nest: bool, longest: int) -> Spec:
    """A branch: 1 to `longest` leaves, or with `nest` (and budget) a nested block with a leaf before or
    after it (never a lone block)."""
    if nest and depth < 2 and budget[0] >= 4 and draw(st.booleans()):
        before = ["L"] * draw(st.integers(0, 1))
        after = ["L"] * (draw(st.integers(0, 1)) if before else 1)
        budget[0] -= len(before) + len(after)
        return [*before, _block(draw, depth + 1, budget, 2, 3, nest, longest), *after]
    length = max(1, min(draw(st.integers(1, longest)), budget[0]))
    budget[0] -= length
    return ["L"] * length


def _block(draw: st.DrawFn, depth: int, budget: list[int], low: int, high: int, nest: bool, longest: int) -> Spec:
    return [_branch(draw, depth, budget, nest, longest) for _ in range(draw(st.integers(low, high)))]


def _top(draw: st.DrawFn, shape: str, small: bool) -> Spec:
    """The top chain (without the output op) for one of SHAPES; `small` keeps it to about 10 ops."""
    if shape == "chain":
        return ["L"] * draw(st.integers(4, 8 if small else 12))
    budget = [draw(st.integers(3, 5) if small else st.integers(6, 12))]
    if shape.startswith("wide"):  # one block of exactly that many branches
        low = high = int(shape[4:])
        nest = False
    else:
        low, high, nest = {"fork_join": (2, 4, False), "two_branch": (2, 2, False), "nested": (2, 3, True)}[shape]
    longest = 1 if small and low >= 5 else 2 if small else 3
    items: Spec = ["L"] * draw(st.integers(0, 1 if small else 2))
    items.append(_block(draw, 0, budget, low, high, nest, longest))
    items += ["L"] * draw(st.integers(0, 1 if small else 2))
    if shape == "nested" and not small and draw(st.booleans()):  # a second block in series, after a leaf
        items += ["L"] if isinstance(items[-1], list) else []
        items.append(_block(draw, 0, budget, 2, 3, nest, longest))
    return items + ["L"] * max(0, MIN_OPS - _count(items))  # the join run grows to MIN_OPS ops


def _count(spec: Spec) -> int:
    return sum(1 if item == "L" else sum(_count(branch) for branch in item) for item in spec)


# ---- ops ------------------------------------------------------------------------------------------
class _Emitter:
    """Turns a spec into ops (depth first) and the canonical tree."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.preds: dict[str, tuple[str, ...]] = {"x": ()}
        self.first_reader: str | None = None

    def op(self, srcs: tuple[str, ...], extra: tuple[str, ...] = ()) -> Leaf:
        name = f"o{len(self.preds)}"
        skips = tuple(src for src in extra if self.draw(st.booleans()))
        self.preds[name] = (srcs or ("x",)) + skips
        if not srcs and self.first_reader is None:
            self.first_reader = name
        return Leaf(ops=(name,))

    def chain(self, spec: Spec, srcs: tuple[str, ...]) -> tuple[Chain, tuple[str, ...]]:
        items: list[Leaf | Block] = []
        for item in spec:
            if item == "L":
                leaf = self.op(srcs, self._skip(items))
                items.append(leaf)
                srcs = leaf.ops
            else:
                branches = [self.chain(branch, srcs) for branch in item]
                items.append(Block(branches=tuple(chain for chain, _ in branches)))
                srcs = tuple(op for _, exits in branches for op in exits)
        return Chain(items=tuple(items)), srcs

    @staticmethod
    def _skip(items: list[Leaf | Block]) -> tuple[str, ...]:
        """A transitive extra input: the leaf two items back (over a leaf or over a whole block)."""
        if len(items) >= 2 and isinstance(items[-2], Leaf):
            return items[-2].ops
        return ()


def _with_input(chain: Chain, reader: str) -> Chain:
    """The tree with `x` in the leaf of its first reader."""
    items: list[Leaf | Block] = []
    for item in chain.items:
        if isinstance(item, Block):
            items.append(Block(branches=tuple(_with_input(branch, reader) for branch in item.branches)))
        else:
            items.append(Leaf(ops=("x", *item.ops)) if item.ops == (reader,) else item)
    return Chain(items=tuple(items))


def _graph(preds: dict[str, tuple[str, ...]], sinks: tuple[str, ...]) -> OpGraph:
    ops = [OpNode(name="x", kind="placeholder", target="x", outputs=(TensorMeta(shape=(1, 8)),))]
    for name, srcs in preds.items():
        if name != "x":
            ops.append(OpNode(name=name, kind="call_function", target=name, inputs=srcs,
                              outputs=(TensorMeta(shape=(1, 8)),),
                              params=(ParamRef(name=f"{name}.weight", num_bytes=4),)))
    ops.append(OpNode(name="output", kind="output", target="output", inputs=sinks))
    return OpGraph(name="random_sp", ops=tuple(ops), example_batch_size=1)


# ---- costs, cluster, memory ---------------------------------------------------------------------
def _costs(draw: st.DrawFn, graph: OpGraph, max_batch: int) -> CostTable:
    entries: dict[str, dict[int, OpCost]] = {}
    for op in graph.ops:
        if op.kind != "call_function":
            entries[op.name] = {size: OpCost(fwd_ms=0.0, bwd_ms=0.0, act_bytes=0, output_bytes=0, param_bytes=0)
                                for size in range(1, max_batch + 1)}
            continue
        slope, overhead = draw(st.integers(1, 48)) / 16, draw(st.sampled_from((0, 4, 16, 32))) / 16
        ratio = draw(st.sampled_from((1.0, 2.0, 3.0)))
        act, out = draw(st.integers(1, 64)) * MiB // 4, draw(st.integers(1, 32)) * MiB // 8
        params = draw(st.sampled_from((0, 16, 64, 256, 1024))) * MiB
        entries[op.name] = {size: OpCost(fwd_ms=overhead + slope * size, bwd_ms=ratio * (overhead + slope * size),
                                         act_bytes=act * size, output_bytes=out * size, param_bytes=params)
                            for size in range(1, max_batch + 1)}
    return CostTable(device="random", source="analytic", entries=entries)


def _cluster(draw: st.DrawFn, num_devices: int) -> Cluster:
    device = Device(name="random-gpu", peak_tflops=100.0, mem_bandwidth_gb_per_s=1000.0, memory_bytes=16 * 2**30,
                    kernel_overhead_us=0.0)
    per_node = draw(st.sampled_from((1, 2, 4, 8)))
    intra = Link(name="intra", latency_us=draw(st.sampled_from((1.0, 5.0))),
                 bandwidth_gb_per_s=draw(st.sampled_from((50.0, 150.0))))
    inter = Link(name="inter", latency_us=draw(st.sampled_from((10.0, 50.0))),
                 bandwidth_gb_per_s=draw(st.sampled_from((2.0, 12.5))))
    return Cluster(name="random", device=device, num_devices=num_devices, devices_per_node=per_node,
                   intra_node=intra, inter_node=inter)


@st.composite
def cases(draw: st.DrawFn, shapes: tuple[str, ...] = SHAPES, max_units: int | None = None) -> Case:
    """A random planning problem of one of `shapes`. With `max_units` (for the exhaustive search) the
    graphs are small and have at most that many units (computing ops plus `output`)."""
    shape = draw(st.sampled_from(shapes))
    emitter = _Emitter(draw)
    tree, sinks = emitter.chain(_top(draw, shape, max_units is not None), ())
    assume(max_units is None or len(emitter.preds) <= max_units)  # x and the computing ops; output on top
    graph = _graph(emitter.preds, sinks)
    assert emitter.first_reader is not None
    tree = _with_input(Chain(items=(*tree.items, Leaf(ops=("output",)))), emitter.first_reader)
    micro_batch = draw(st.sampled_from((1, 2, 4, 8)))
    global_batch = micro_batch * draw(st.sampled_from((1, 2, 4, 8)))
    num_devices = draw(st.integers(2, min(8, len(graph))))
    return Case(shape=shape, graph=graph, tree=tree, costs=_costs(draw, graph, micro_batch),
                cluster=_cluster(draw, num_devices), global_batch_size=global_batch, micro_batch_size=micro_batch,
                tightness=draw(st.sampled_from((0.5, 0.7, 0.85, 0.95))))
