"""The optimum of graphpipe's planning space for one micro-batch size: a slow, plain DP (a test oracle).

It shares no code with `graphpipe.planner`: it reads the op graph, the cost table's stored entries
and the cluster's numbers, re-derives the communication and memory formulas from docs/method.md §2-§3,
prices a stage with the one stage-cost rule every pricer calls (`graphpipe.cost.formulas.time_per_sample`),
and takes the graph's SP tree from the caller (`random_sp_graphs` builds each graph from its tree).

Space. Stage graphs for micro-batch size b on at most N devices, each stage on d devices with d
dividing b (every device takes b / d whole samples), in the space docs/method.md §4 gives the DP:

- a chain's items [i, e) are staged as a run of items [i, j) as one stage, then the rest; or, when
  item i is a parallel block, the block, then the rest; or an absorbed block (below), then the rest;
- a block's branches are grouped: a group is one branch staged as a chain, or several whole branches
  as one stage; any grouping with at most 4 branches, else runs of the branches sorted by compute
  (fwd + bwd at the cost table's largest size, descending; ties keep the branches' order);
- a join run's stage, for blocks of more than 4 branches: J (all the leaves right after the block) and the
  last g branches of the sorted order (1 <= g < all) as one stage, the other branches grouped before it;
- absorption, for blocks of at most 4 branches, with F the leaves right before the block (from any
  start) and J all the leaves right after it: F joins the first stage of one branch (a run of
  [F] + that branch from its start, never reaching J when the same lane ends in J), J the last stage
  of one branch (the lane is that branch + [J]); for two branches J may instead take the tails of
  both branches (each non-empty) in one merge stage;
- and, beside these, every cut of the units in topological order into runs (a chain plan), run as
  a chain: graphpipe joins consecutive stages of a chain plan by ordering edges, so stage i of k holds
  k - i micro-batches even where no tensor passes between them.

Objective: the smallest bottleneck (largest stage TPS), every stage's memory within the limit.

With `recompute`, every stage may instead recompute its forward in its backward (docs/method.md, "Activation
recomputation"): one more forward of its ops in its TPS, and in memory one micro-batch's activations plus, per
held micro-batch, its inputs (the producers outside S it reads, and the model inputs among its ops, at b / d).
Each stage takes whichever variant is better where both fit (`StageModel.variants`), so the optimum covers the
choice per stage.

    TPS(S, d)  = (fwd + bwd + comm + actions) / b + (all_reduce + step) / B     (costs read at b / d samples;
                 actions: the device's per-micro-batch action overheads, step: its optimizer step)
    comm       = 2 (messages · latency + bytes per sample · b / d / bandwidth), messages = producers
                 outside S read inside + ops of S read outside (data edges only: inputs are replicated)
    all_reduce = 2 (d - 1) / d · params / bandwidth + 2 (d - 1) · latency, 0 when d = 1
    memory(S, d, n) = 4 · params + min(n, B / b) · activations at b / d

Point-to-point traffic goes over the inter-node link when the cluster has several nodes, the
all-reduce over the intra-node link when d fits in a node. In-flight, in micro-batches (one b for
all stages): a sink stage holds 1, any other stage 1 + the most any successor holds.

Tables. Every part (items of a chain, a block's branches, a group) answers a table over d = 0..N
devices and v = 0..N micro-batches:

    t[d, v] = the smallest bottleneck of a staging of the part on at most d devices whose entry stages
              (those the part's predecessor feeds) hold at most v micro-batches each, given that what
              follows the part holds k; inf when there is none.

The predecessor then holds at most v + 1. A count never exceeds N (each stage on a path has a device
of its own), so v = N means "any", and the answer is chain(top, 0, end, 0)[N, N]. Recurrences:

    chain(c, i, e, k)  = empty(k) when i = e (t = 0 where v >= k), else the least of
                         stage_before(items i..j-1, chain(c, j, e, k))               for every j <= e
                         part_before(k' -> groups(item i, all, k'), chain(c, i + 1, e, k))   item i a block
                         part_before(k' -> absorbed(c, i, J, k'), chain(c, after, e, k))     absorption
                         part_before(k' -> joined(c, i, k'), chain(c, after, e, k))     J's stage, > 4 branches
    groups(P, R, k)    = least over the groups g of R holding R[0] of beside(group(g, k), groups(P, R - g, k))
    group(g, k)        = chain(branch, 0, end, k) for one branch, else lone_stage(their union, k + 1)
    joined(c, i, k)    = least over g of beside(lone_stage(J + the last g sorted branches, k + 1),
                                               groups(P, the other branches, k + 1))
    absorbed           = least over the layouts of beside(the lanes and the grouped others), with F's stage
                         stage_before the rest of its lane beside the others (`fork_stage`)
where
    beside(a, b)[d, v]       = min over d1 of max(a[d1, v], b[d - d1, v])      (devices add up)
    stage_before(S, r)[d, v] = min over d1 | b of max(TPS(S, d1), r[d - d1, min(v, held) - 1]),
                               held = the most micro-batches S fits on d1 devices (at least 1)
    part_before(p, r)[d, v]  = min over k, d1 of max(p(k)[d1, v], r[d - d1, k])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from graphpipe.cost.cluster import Cluster, Link
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.time_per_sample import time_per_sample_ms
from graphpipe.graph.op_graph import OpGraph
from tests.planner.random_sp_graphs import Block, Chain, Leaf

Table = np.ndarray  # float, shape (N + 1, N + 1): [devices, entry bound]
MAX_ENUMERATED = 4  # blocks up to this many branches: every grouping, and absorption
INF = math.inf


class StageModel:
    """TPS and memory of an op set run as one stage (the formulas of the module docstring)."""

    def __init__(self, graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
                 micro_batch_size: int, memory_limit: float, recompute: bool = False) -> None:
        self.costs, self.cluster, self.limit, self.recompute = costs, cluster, memory_limit, recompute
        self.inputs = frozenset(graph.inputs)
        self.big_b, self.b = global_batch_size, micro_batch_size
        replicated = {op.name for op in graph.ops if op.replicated}
        self.preds = {op.name: [src for src in dict.fromkeys(op.inputs) if src not in replicated] for op in graph.ops}
        self.read_outside: dict[str, list[str]] = {op.name: [] for op in graph.ops}
        for op, srcs in self.preds.items():
            for src in srcs:
                self.read_outside[src].append(op)
        ref = max(size for per in costs.entries.values() for size in per)
        self.out_per_sample = {op: costs.entries[op][ref].output_bytes / ref for op in graph.names}
        self.params = {op: costs.entries[op][ref].param_bytes for op in graph.names}
        self._cache: dict[tuple[frozenset[str], int], tuple[float, float, float]] = {}
        self._again: dict[tuple[frozenset[str], int], tuple[float, float]] = {}  # recomputing: (TPS, input bytes)
        self._held: dict[tuple[frozenset[str], int, int, bool], int] = {}

    def _numbers(self, ops: frozenset[str], d: int) -> tuple[float, float, float]:
        """(TPS, static bytes, activation bytes of one micro-batch) of `ops` on `d` devices."""
        key = (ops, d)
        if key not in self._cache:
            share = self.b // d
            assert share * d == self.b, "a data-parallel degree must divide the micro-batch"
            rows = [self.costs.entries[op][share] for op in ops]  # stored sizes only: no interpolation
            compute = sum(row.fwd_ms + row.bwd_ms for row in rows)
            recv = {src for op in ops for src in self.preds[op] if src not in ops}
            send = {op for op in ops if any(dst not in ops for dst in self.read_outside[op])}
            comm = _p2p_ms(self._p2p_link(), len(recv) + len(send),
                           sum(self.out_per_sample[op] for op in recv | send) * share)
            params = sum(self.params[op] for op in ops)
            tps = time_per_sample_ms(self.cluster.device, compute, comm, self._all_reduce_ms(params, d), params, self.b,
                                     self.big_b)
            self._cache[key] = (tps, 4.0 * params, float(sum(row.act_bytes for row in rows)))
            if self.recompute:  # one more forward of the ops; held micro-batches keep their inputs only
                again = time_per_sample_ms(self.cluster.device, compute + sum(row.fwd_ms for row in rows), comm,
                                           self._all_reduce_ms(params, d), params, self.b, self.big_b)
                inputs = sum(self.out_per_sample[src] for src in recv) * share + sum(
                    self.costs.entries[op][share].output_bytes for op in ops if op in self.inputs)
                self._again[key] = (again, float(round(inputs)))
        return self._cache[key]

    def _p2p_link(self) -> Link:
        nodes = -(-self.cluster.num_devices // self.cluster.devices_per_node)
        return self.cluster.intra_node if nodes <= 1 else self.cluster.inter_node

    def _all_reduce_ms(self, grad_bytes: float, d: int) -> float:
        if d <= 1 or grad_bytes <= 0:
            return 0.0
        link = self.cluster.node_collective if d <= self.cluster.devices_per_node else self.cluster.inter_node
        steps = 2 * (d - 1)
        return steps / d * grad_bytes / (link.bandwidth_gb_per_s * 1e9) * 1e3 + steps * link.latency_us / 1e3

    def tps(self, ops: frozenset[str], d: int) -> float:
        return self._numbers(ops, d)[0]

    def memory(self, ops: frozenset[str], d: int, count: int, again: bool = False) -> float:
        """Peak bytes holding `count` micro-batches; `again`: recomputing, each held micro-batch keeps its inputs
        and one keeps its activations while its backward recomputes them."""
        _, static, acts = self._numbers(ops, d)
        held = min(count, self.big_b // self.b)
        if not again:
            return static + held * acts
        return static + acts + held * self._again[(ops, d)][1]

    def most_held(self, ops: frozenset[str], d: int, cap: int, again: bool = False) -> int:
        """The most micro-batches (up to `cap`) the stage can hold within the limit; 0: not even one."""
        key = (ops, d, cap, again)
        if key not in self._held:
            self._held[key] = max((k for k in range(1, cap + 1) if self.memory(ops, d, k, again) <= self.limit),
                                  default=0)
        return self._held[key]

    def variants(self, ops: frozenset[str], d: int, cap: int) -> list[tuple[float, int]]:
        """(TPS, most micro-batches held) of the stage keeping its activations and, with `recompute`, recomputing."""
        keep = [(self.tps(ops, d), self.most_held(ops, d, cap))]
        if not self.recompute:
            return keep
        return [*keep, (self._again[(ops, d)][0], self.most_held(ops, d, cap, again=True))]


def _p2p_ms(link: Link, messages: int, num_bytes: float) -> float:
    if messages <= 0:
        return 0.0
    return 2 * (messages * link.latency_us / 1e3 + num_bytes / (link.bandwidth_gb_per_s * 1e9) * 1e3)


def topological_chain(graph: OpGraph) -> Chain:
    """The linearised graph: one leaf per op in the graph's (topological) order, inputs riding with their first
    reader (the units of a chain plan)."""
    leaves: dict[str, list[str]] = {op.name: [op.name] for op in graph.ops if not op.replicated}
    for op in graph.ops:
        if op.replicated:
            first = next(reader.name for reader in graph.ops if op.name in reader.inputs)
            leaves[first].insert(0, op.name)
    return Chain(items=tuple(Leaf(ops=tuple(ops)) for ops in leaves.values()))


def _ops(items: Iterable[Leaf | Block | Chain]) -> frozenset[str]:
    return frozenset(op for item in items for op in item.ops)


class ReferenceDP:
    """Min-max DP over the space of the module docstring (tables memoised per part and k_after)."""

    def __init__(self, tree: Chain, graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
                 micro_batch_size: int, memory_limit: float, recompute: bool = False) -> None:
        self.tree, self.linear = tree, topological_chain(graph)  # kept alive: the memo is keyed by id
        self.model = StageModel(graph, costs, cluster, global_batch_size, micro_batch_size, memory_limit, recompute)
        self.n = cluster.num_devices
        self.degrees = [d for d in range(1, min(micro_batch_size, self.n) + 1) if micro_batch_size % d == 0]
        ref = max(size for per in costs.entries.values() for size in per)
        self.weight = {op: costs.entries[op][ref].fwd_ms + costs.entries[op][ref].bwd_ms for op in graph.names}
        self.memo: dict[tuple, Table] = {}
        self.lanes: dict[tuple, Chain] = {}
        d, d1 = np.meshgrid(range(self.n + 1), range(self.n + 1), indexing="ij")
        self._rest_of, self._split_ok = np.maximum(d - d1, 0), (d1 <= d)[:, :, None]  # for `beside`

    def optimum(self) -> float:
        """The smallest bottleneck TPS over the whole space (inf: nothing fits)."""
        return min(self.graph_optimum(), self.chain_optimum())

    def graph_optimum(self) -> float:
        return float(self.chain(self.tree, 0, len(self.tree.items), 0)[self.n, self.n])

    def chain_optimum(self) -> float:
        return float(self.chain(self.linear, 0, len(self.linear.items), 0)[self.n, self.n])

    # ---- tables ------------------------------------------------------------------------------
    def _inf(self) -> Table:
        return np.full((self.n + 1, self.n + 1), INF)

    def empty(self, k_after: int) -> Table:
        """An empty part: its predecessor feeds what follows directly."""
        out = np.zeros((self.n + 1, self.n + 1))
        out[:, :k_after] = INF
        return out

    def beside(self, a: Table, b: Table) -> Table:
        """Two parts fed by the same predecessor: their devices add up, the entry bound holds for both.
        out[d, v] = min over d1 <= d of max(a[d1, v], b[d - d1, v])."""
        pairs = np.maximum(a[None, :, :], b[self._rest_of])  # [d, d1, v], d - d1 read as 0 where d1 > d
        return np.where(self._split_ok, pairs, INF).min(axis=1)

    def stage_before(self, ops: frozenset[str], rest: Table) -> Table:
        """One stage whose successors are the entries of `rest`: it holds 1 + what they hold, which must be
        at most v and fit its memory; `rest` only gets better with a looser bound, so take the loosest.
        out[d, v] = min over d1 of max(TPS(ops, d1), rest[d - d1, min(v, most held) - 1])."""
        out = self._inf()
        for d1 in self.degrees:
            for tps, held in self.model.variants(ops, d1, self.n):
                if held:
                    bound = np.minimum(np.arange(self.n), held - 1)  # for v = 1..N
                    cand = np.maximum(tps, rest[: self.n + 1 - d1, bound])
                    out[d1:, 1:] = np.minimum(out[d1:, 1:], cand)
        return out

    def part_before(self, part_at: Callable[[int], Table], rest: Table) -> Table:
        """A part followed by `rest`, over every bound k on what the rest's entries hold (the part is then
        solved given k_after = k). out[d, v] = min over k, d1 of max(part_at(k)[d1, v], rest[d - d1, k])."""
        out = self._inf()
        for k in range(self.n + 1):
            if rest[self.n, k] < INF:
                column = np.repeat(rest[:, k : k + 1], self.n + 1, axis=1)
                out = np.minimum(out, self.beside(part_at(k), column))
        return out

    def lone_stage(self, ops: frozenset[str], count: int, entry: bool) -> Table:
        """One stage that holds `count` micro-batches, on the fastest degree that fits (merged branches: an entry,
        so v >= count; a merge stage: not an entry). out[d, v] = min over d1 <= d that fit of TPS(ops, d1)."""
        out = self._inf()
        for d1 in self.degrees:
            for tps, held in self.model.variants(ops, d1, self.n):
                if held >= count:
                    out[d1:, count if entry else 0 :] = np.minimum(out[d1:, count if entry else 0 :], tps)
        return out

    # ---- chains ------------------------------------------------------------------------------
    def chain(self, c: Chain, i: int, e: int, k_after: int) -> Table:
        """Items [i, e) of chain c, followed by something holding k_after."""
        key = ("chain", id(c), i, e, k_after)
        if key not in self.memo:
            self.memo[key] = self._chain(c, i, e, k_after)
        return self.memo[key]

    def _chain(self, c: Chain, i: int, e: int, k_after: int) -> Table:
        if i == e:
            return self.empty(k_after)
        out = self._inf()
        for j in range(i + 1, e + 1):  # items [i, j) as one stage
            out = np.minimum(out, self.stage_before(_ops(c.items[i:j]), self.chain(c, j, e, k_after)))
        item = c.items[i]
        if isinstance(item, Block):  # open the block
            out = np.minimum(out, self.part_before(lambda k: self.groups(item, self.order(item), k),
                                                   self.chain(c, i + 1, e, k_after)))
        found = _block_at(c, i)
        if isinstance(item, Block) and len(item.branches) > MAX_ENUMERATED and found is not None:
            stop = found[2]
            if i + 1 < stop <= e:  # J's stage takes the lightest branches whole
                out = np.minimum(out, self.part_before(lambda k: self.joined(c, i, k), self.chain(c, stop, e, k_after)))
        if found is not None and len(found[1].branches) <= MAX_ENUMERATED:
            pos, _, stop = found
            if pos > i and pos < e:  # F absorbed, J left to the chain
                out = np.minimum(out, self.part_before(lambda k: self.absorbed(c, i, False, k),
                                                       self.chain(c, pos + 1, e, k_after)))
            if stop > pos + 1 and stop <= e:  # J absorbed (and F when there is one)
                out = np.minimum(out, self.part_before(lambda k: self.absorbed(c, i, True, k),
                                                       self.chain(c, stop, e, k_after)))
        return out

    # ---- blocks ------------------------------------------------------------------------------
    def order(self, block: Block) -> tuple[int, ...]:
        """Branch positions, by descending compute when groups are runs (more than 4 branches)."""
        count = len(block.branches)
        if count <= MAX_ENUMERATED:
            return tuple(range(count))
        weights = [sum(self.weight[op] for op in branch.ops) for branch in block.branches]
        return tuple(sorted(range(count), key=lambda r: -weights[r]))

    def groups(self, block: Block, rest: tuple[int, ...], k_after: int) -> Table:
        """The branches `rest` of a block (feeding what holds k_after), grouped; the group of rest[0] first."""
        key = ("groups", id(block), rest, k_after)
        if key in self.memo:
            return self.memo[key]
        if not rest:
            return np.zeros((self.n + 1, self.n + 1))
        out = self._inf()
        for group in _groups_with_first(rest, runs_only=len(block.branches) > MAX_ENUMERATED):
            others = tuple(r for r in rest if r not in group)
            if len(group) == 1:
                part = self.chain(block.branches[group[0]], 0, len(block.branches[group[0]].items), k_after)
            else:
                part = self.lone_stage(_ops(block.branches[r] for r in group), k_after + 1, entry=True)
            out = np.minimum(out, self.beside(part, self.groups(block, others, k_after)))
        self.memo[key] = out
        return out

    def joined(self, c: Chain, i: int, k_after: int) -> Table:
        """The block at item i (more than 4 branches) and its join run J as J's stage with the last g >= 1 branches
        of the sorted order (not all), holding k_after + 1; the other branches feed it, grouped."""
        key = ("joined", id(c), i, k_after)
        if key not in self.memo:
            found = _block_at(c, i)
            assert found is not None and found[0] == i
            _, block, stop = found
            join, order = _ops(c.items[i + 1 : stop]), self.order(block)
            out = self._inf()
            for cut in range(1, len(order)):
                stage = self.lone_stage(join | _ops(block.branches[r] for r in order[cut:]), k_after + 1, entry=True)
                out = np.minimum(out, self.beside(stage, self.groups(block, order[:cut], k_after + 1)))
            self.memo[key] = out
        return self.memo[key]

    def lane(self, block: Block, r: int, join: frozenset[str]) -> Chain:
        """Branch r, with the join run J (if any) as one last leaf; one object per content (the memo's key)."""
        key = (id(block), r, tuple(sorted(join)))
        if key not in self.lanes:
            self.lanes[key] = Chain(items=block.branches[r].items + ((Leaf(ops=key[2]),) if join else ()))
        return self.lanes[key]

    def absorbed(self, c: Chain, i: int, with_join: bool, k_after: int) -> Table:
        """The block after the leaves c.items[i:pos] (F, maybe none), with its join run J when `with_join`."""
        key = ("absorbed", id(c), i, with_join, k_after)
        if key not in self.memo:
            found = _block_at(c, i)
            assert found is not None
            pos, block, stop = found
            fork, join = _ops(c.items[i:pos]), _ops(c.items[pos + 1 : stop]) if with_join else frozenset()
            k_side = k_after + 1 if with_join else k_after  # what the branches feed: J's stage, or what follows
            out = self._plain_layouts(block, fork, join, k_after, k_side)
            if join and len(block.branches) == 2:
                out = np.minimum(out, self._merged(block, fork, join, k_side))
            self.memo[key] = out
        return self.memo[key]

    def _plain_layouts(self, block: Block, fork: frozenset[str], join: frozenset[str], k_after: int,
                       k_side: int) -> Table:
        """F in the first stage of branch rf, J in the last stage of branch rj, the other branches grouped."""
        count = len(block.branches)
        out = self._inf()
        for rj in range(count) if join else (None,):
            for rf in range(count) if fork else (None,):
                side = self.groups(block, tuple(r for r in range(count) if r not in (rf, rj)), k_side)
                if rj is not None and rj != rf:  # B_rj + [J], followed by what follows the block
                    lane = self.lane(block, rj, join)
                    side = self.beside(side, self.chain(lane, 0, len(lane.items), k_after))
                if rf is None:
                    out = np.minimum(out, side)
                elif rf == rj:  # [F] + B + [J]: F's stage never takes J
                    lane = self.lane(block, rf, join)
                    size = len(lane.items)
                    out = np.minimum(out, self.fork_stage(fork, lane, size - 1, size, k_after, side))
                else:  # [F] + B_rf, followed by J's stage (or what follows the block)
                    lane = self.lane(block, rf, frozenset())
                    size = len(lane.items)
                    out = np.minimum(out, self.fork_stage(fork, lane, size, size, k_side, side))
        return out

    def _merged(self, block: Block, fork: frozenset[str], join: frozenset[str], k_side: int) -> Table:
        """Merge stages: the tails of both branches from s0 and s1 (non-empty) and J, holding k_side."""
        first, second = (branch.items for branch in block.branches)
        out = self._inf()
        for s0 in range(len(first)):
            for s1 in range(len(second)):
                merge = self.lone_stage(_ops(first[s0:] + second[s1:]) | join, k_side, entry=False)
                cuts = (s0, s1)
                for rf in (0, 1) if fork else (None,):
                    side = merge
                    for r in (0, 1):
                        if r != rf:
                            side = self.beside(side, self.chain(block.branches[r], 0, cuts[r], k_side))
                    if rf is None:
                        out = np.minimum(out, side)
                    else:
                        lane = block.branches[rf]
                        out = np.minimum(out, self.fork_stage(fork, lane, cuts[rf], cuts[rf], k_side, side))
        return out

    def fork_stage(self, fork: frozenset[str], body: Chain, last_cut: int, end: int, k_lane: int,
                   side: Table) -> Table:
        """F's stage = F + body items [0, cut) for cut <= last_cut; then the rest of the lane (body items
        [cut, end), followed by what holds k_lane) beside `side`: F's stage feeds both."""
        out = self._inf()
        for cut in range(last_cut + 1):
            rest = self.beside(self.chain(body, cut, end, k_lane), side)
            out = np.minimum(out, self.stage_before(fork | _ops(body.items[:cut]), rest))
        return out


def _block_at(c: Chain, i: int) -> tuple[int, Block, int] | None:
    """(pos, block, stop): the first block at or after item i with only leaves before it from i, and stop
    the end of the leaves after it (the next block or the chain's end)."""
    pos = i
    while pos < len(c.items) and isinstance(c.items[pos], Leaf):
        pos += 1
    if pos == len(c.items):
        return None
    stop = pos + 1
    while stop < len(c.items) and isinstance(c.items[stop], Leaf):
        stop += 1
    block = c.items[pos]
    assert isinstance(block, Block)
    return pos, block, stop


def _groups_with_first(rest: tuple[int, ...], runs_only: bool) -> Iterable[tuple[int, ...]]:
    """The groups that contain rest[0]: runs rest[:j] (runs of the sorted order), or any subset of the rest."""
    if runs_only:
        return (rest[:j] for j in range(1, len(rest) + 1))
    tail = rest[1:]
    return ((rest[0], *(tail[t] for t in range(len(tail)) if mask >> t & 1)) for mask in range(1 << len(tail)))


def reference_optimum(tree: Chain, graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
                      micro_batch_size: int, memory_limit: float) -> float:
    """The smallest bottleneck TPS over the space (inf when no stage graph fits)."""
    return ReferenceDP(tree, graph, costs, cluster, global_batch_size, micro_batch_size, memory_limit).optimum()
