"""Per-tree tables of the DP, the same for every micro-batch size and target: chains and parallel blocks.

A segment is items [i, j) of one chain of the SP tree. Compute time, activations and
parameters of a segment are prefix-sum differences (`ChainInfo.prefix_at`). The traffic across
its boundary (messages and bytes per sample, on the real op edges) is grown item by item from i,
lazily, only as far as a caller asks (`ChainInfo.boundary`); the DP reads every segment's at once
from `ChainInfo.boundary_matrix`, which lays each tensor's contribution down as rectangles of
segments (vectorised, with the same numbers as the item-by-item rows; chains of up to ROWS_UP_TO
items grow the rows instead: numpy's fixed cost per call outweighs their few cells).

`ParInfo` orders a parallel block's branches (by compute, heaviest first) and costs merged
groups of them. `ChainTables` owns every `ChainInfo` and `ParInfo` of one tree by index (the
DP's memo keys), including the extended chains of fork/join absorption (a branch with its
fork and/or join run), which it creates when the DP first asks for them.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from graphpipe.graph.sp import SPChain, SPLeaf, SPParallel
from graphpipe.planner.sp_dp.blocks import MAX_ENUMERATED_BRANCHES, ForkJoin, fork_join_items
from graphpipe.planner.stage_cost import CostModel

ROWS_UP_TO = 12  # chains this short grow their rows in Python faster than numpy lays down rectangles


class _Row:
    """Boundary traffic of segments [i, j) for growing j."""

    def __init__(self, info: ChainInfo, start: int) -> None:
        self.info = info
        self.next_item = start
        self.inside: set[str] = set()
        self.outside_succs: dict[str, int] = {}
        self.recv: set[str] = set()
        self.send: set[str] = set()
        self.num_bytes = 0.0
        self.messages: list[int] = [0]
        self.bytes_per_sample: list[float] = [0.0]

    def extend_to(self, stop: int) -> None:
        model = self.info.model
        size = model.out_bytes_per_sample
        while self.next_item < stop:
            for op in self.info.item_ops[self.next_item]:
                self.inside.add(op)
                for pred in model.preds[op]:
                    if pred in self.inside:
                        self.outside_succs[pred] -= 1
                        if not self.outside_succs[pred] and pred in self.send:
                            self.send.discard(pred)
                            self.num_bytes -= size[pred]
                    elif pred not in self.recv:
                        self.recv.add(pred)
                        self.num_bytes += size[pred]
                self.outside_succs[op] = len(model.succs[op])
                if self.outside_succs[op]:
                    self.send.add(op)
                    self.num_bytes += size[op]
            self.next_item += 1
            self.messages.append(len(self.recv) + len(self.send))
            self.bytes_per_sample.append(self.num_bytes)


class ChainInfo:
    """What the DP reads about one chain, independent of the micro-batch size and the target."""

    def __init__(self, model: CostModel, chain: SPChain, index: int = -1,
                 par_infos: Sequence[ParInfo | None] | None = None) -> None:
        self.model = model
        self.chain = chain
        self.index = index  # in its `ChainTables` (-1: a chain on its own)
        self.content = index  # the DP's memo key: the index of the first chain of identical content (`share_with`)
        self.par_infos = tuple(par_infos) if par_infos is not None else (None,) * len(chain.items)  # per item
        self.item_ops = tuple(item.ops for item in chain.items)
        self.num_items = len(self.item_ops)
        prefix = [0]
        for ops in self.item_ops:
            prefix.append(prefix[-1] + sum(model.param_bytes[op] for op in ops))
        self.param_prefix = prefix
        self._per_batch: dict[float, tuple[list[float], list[float]]] = {}
        self._rows: dict[int, _Row] = {}
        self._arrays: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self._matrix: tuple[np.ndarray, np.ndarray] | None = None
        self._incoming: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.next_parallel = [self.num_items] * (self.num_items + 1)  # first parallel block at or after i
        for idx in range(self.num_items - 1, -1, -1):
            is_par = isinstance(chain.items[idx], SPParallel)
            self.next_parallel[idx] = idx if is_par else self.next_parallel[idx + 1]
        self.has_parallel = self.next_parallel[0] < self.num_items
        self._blocks: dict[int, Block | None] = {}
        self.prefix_of: ChainInfo | None = None  # a chain whose items are this one's but the last (`extended`)
        self.param_array = np.array(prefix, dtype=float)

    @cached_property
    def cuts(self) -> list[int]:
        """The positions 0 .. num_items that no join run spans: a parallel item's join run is the items after it up
        to the next one (`blocks.fork_join_items`), and a block's stages may hold items on both sides of a position
        inside it. Built when a merge stage's lane first asks (`cut_at`)."""
        cuts, join_end = [], 0
        for pos in range(self.num_items + 1):
            if pos >= join_end:
                cuts.append(pos)
            if pos < self.num_items and self.next_parallel[pos] == pos:
                join_end = self.next_parallel[pos + 1]
        return cuts

    def cut_at(self, end: int) -> int:
        """The last position at or before `end` that no join run spans (`cuts`): cut there, a staging of the prefix
        [0, end) keeps each of its blocks whole or loses it (`Probe.cut_floor`)."""
        return self.cuts[bisect_right(self.cuts, end) - 1]

    def share_with(self, twin: ChainInfo) -> None:
        """Make this chain a twin of `twin` (`ChainTables.twin_of`): its tables, and the DP's rows (keyed by
        `content`), are the twin's; only its ops (read when the stages are rebuilt) stay its own."""
        self.content = twin.content
        self._per_batch, self._arrays = twin._per_batch, twin._arrays
        self._matrix = twin.boundary_matrix()

    def prefix_at(self, per_device_batch: float) -> tuple[list[float], list[float]]:
        """Prefix sums of (fwd + bwd ms, act bytes) over items at `per_device_batch` samples."""
        hit = self._per_batch.get(per_device_batch)
        if hit is None:
            times, acts = [0.0], [0.0]
            group_at = self.model.group_at
            for ops in self.item_ops:
                time_ms, act = group_at(ops, per_device_batch)
                times.append(times[-1] + time_ms)
                acts.append(acts[-1] + act)
            hit = self._per_batch[per_device_batch] = (times, acts)
        return hit

    def boundary(self, start: int, stop: int) -> tuple[int, float]:
        """(messages, bytes per sample) crossing the boundary of items [start, stop)."""
        row = self._rows.get(start)
        if row is None:
            row = self._rows[start] = _Row(self, start)
        row.extend_to(stop)
        return row.messages[stop - start], row.bytes_per_sample[stop - start]

    def wiring(self) -> tuple[object, ...]:
        """What the DP reads of the chain, with its ops replaced by their positions: per item, per op in order,
        its costs (`CostTable.cost_classes`), weights, output bytes, number of readers, and its producers:
        positions in the chain and outside producers (numbered by first read, with their output bytes),
        each sorted. Chains of equal wiring are the same graph under the map between their ops (and between
        their outside producers that the numbering gives), at the same costs: the same segment costs and the
        same traffic across every segment; the same floats where every partial sum of bytes is exact
        (`exact_traffic`), whatever order the edges are listed in."""
        model, size = self.model, self.model.out_bytes_per_sample
        classes = model.costs.cost_classes
        position = {op: idx for idx, op in enumerate(op for ops in self.item_ops for op in ops)}
        outside: dict[str, int] = {}
        out: list[object] = []
        for ops in self.item_ops:
            item: list[object] = []
            for op in ops:
                inside: list[int] = []
                reads: list[str] = []
                for pred in model.preds[op]:
                    at = position.get(pred)
                    if at is None:
                        reads.append(pred)
                    else:
                        inside.append(at)
                fresh = [pred for pred in reads if pred not in outside]
                for pred in sorted(fresh, key=size.__getitem__) if len(fresh) > 1 else fresh:
                    outside[pred] = len(outside)
                item.append((classes[op], model.param_bytes[op], size[op], len(model.succs[op]), tuple(sorted(inside)),
                             tuple(sorted((outside[pred], size[pred]) for pred in reads))))
            out.append(tuple(item))
        return tuple(out)

    def exact_traffic(self) -> bool:
        """Every partial sum of the bytes the chain's boundaries carry is exact in floating point (`exact_sums`
        over the outputs of its ops and of the producers it reads), so any order of adding them is the same."""
        size = self.model.out_bytes_per_sample
        tensors = {op for ops in self.item_ops for op in ops}
        tensors.update(pred for op in list(tensors) for pred in self.model.preds[op])
        return exact_sums([size[op] for op in tensors])

    def boundary_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(messages, bytes per sample) of every segment [i, j) as (L + 1) x (L + 1) arrays (j > i)."""
        if self._matrix is None:
            small = self.num_items <= ROWS_UP_TO
            self._matrix = (None if small else boundary_rectangles(self)) or self.boundary_matrix_by_rows()
        return self._matrix

    def boundary_matrix_by_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """`boundary_matrix` grown row by row (`_Row`): the reference the rectangles must equal."""
        size = self.num_items + 1
        messages, num_bytes = np.zeros((size, size)), np.zeros((size, size))
        for start in range(self.num_items):
            row = self._rows.get(start) or _Row(self, start)
            row.extend_to(self.num_items)
            messages[start, start:] = row.messages
            num_bytes[start, start:] = row.bytes_per_sample
        return messages, num_bytes

    def incoming(self, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Per start i < `stop`, (messages, bytes per sample) of the tensors that enter segment [i, stop): the
        receiving side of its boundary (`boundary`), at most that of any longer segment [i, j) (a tensor entering
        [i, stop) is made before i, so it enters [i, j) too). The bytes are scaled down by a hair: summed in another
        order than the boundary's, they must not round above it. Memoised per stop."""
        hit = self._incoming.get(stop)
        if hit is None:
            model = self.model
            inside: set[str] = set()
            recv: set[str] = set()
            messages, num_bytes = np.zeros(stop), np.zeros(stop)
            for start in range(stop - 1, -1, -1):
                ops = self.item_ops[start]
                inside.update(ops)
                recv.difference_update(ops)
                recv.update(pred for op in ops for pred in model.preds[op] if pred not in inside)
                messages[start] = len(recv)
                num_bytes[start] = sum(model.out_bytes_per_sample[pred] for pred in recv) * (1 - 1e-9)
            hit = self._incoming[stop] = (messages, num_bytes)
        return hit

    def prefix_arrays(self, per_device_batch: float) -> tuple[np.ndarray, np.ndarray]:
        hit = self._arrays.get(per_device_batch)
        if hit is None:
            times, acts = self.prefix_at(per_device_batch)
            hit = self._arrays[per_device_batch] = (np.array(times), np.array(acts))
        return hit

    def fork_join(self, start: int) -> Block | None:
        """The fork/join block starting at item `start` (`blocks.fork_join_items`) with its parallel block's
        tables, cached."""
        if start not in self._blocks:
            found = fork_join_items(self.chain, start)
            self._blocks[start] = None if found is None else Block.of(found, self.par_infos[found.par_pos])
        return self._blocks[start]

    def ops(self, start: int, stop: int) -> tuple[str, ...]:
        return tuple(op for ops in self.item_ops[start:stop] for op in ops)


Rect = tuple[int, int, int, int, float]  # rows i in [r0, r1], columns j in [c0, c1], bytes per sample


def boundary_rectangles(info: ChainInfo) -> tuple[np.ndarray, np.ndarray] | None:
    """`ChainInfo.boundary_matrix` as sums of rectangles, or None where that could differ from `_Row`.

    A tensor is received by [i, j) once when its producer is outside and a consumer inside, and
    sent once when its producer is inside and a consumer outside; for each tensor the segments
    where that holds are rectangles of (i, j), so both counts are 2-D prefix sums of their corners.
    Same numbers as `_Row` when the ops are in topological order along the chain (what `_Row`
    assumes too) and every partial byte sum is exact in floating point; otherwise None.
    """
    pos = {op: idx for idx, ops in enumerate(info.item_ops) for op in ops}
    if not _topological(info, pos):
        return None
    rects = _recv_rects(info, pos) + _send_rects(info, pos)
    if not exact_sums([rect[4] for rect in rects]):
        return None
    side = info.num_items + 1
    return rectangle_sums([(r0, r1, c0, c1, 1, weight) for r0, r1, c0, c1, weight in rects], (side, side))


def rectangle_sums(rects: Sequence[tuple[int, int, int, int, int, float]] | np.ndarray,
                   shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per cell of a `shape` grid, the sums of the counts and of count x weight over the rectangles that cover it:
    each (r0, r1, c0, c1, count, weight) covers rows r0 to r1 and columns c0 to c1, both inclusive. Through 2-D
    prefix sums of their corners, so the float sums are in no fixed order: exact where `exact_sums` of the
    weights holds."""
    rows, cols = shape[0] + 1, shape[1] + 1
    r0, r1, c0, c1, count, weight = np.array(rects, dtype=float).reshape(-1, 6).T
    flat = np.concatenate([r0 * cols + c0, r0 * cols + c1 + 1, (r1 + 1) * cols + c0, (r1 + 1) * cols + c1 + 1])
    sign = np.repeat([1.0, -1.0, -1.0, 1.0], len(r0))
    corners = [np.bincount(flat.astype(np.int64), weights=sign * np.tile(values, 4), minlength=rows * cols)
               .astype(float, copy=False).reshape(rows, cols) for values in (count, count * weight)]
    counts, weighted = (corner.cumsum(axis=0).cumsum(axis=1)[:-1, :-1] for corner in corners)
    return counts, weighted


def _topological(info: ChainInfo, pos: dict[str, int]) -> bool:
    """Every in-chain producer comes before its consumers in the chain's op order."""
    seen: set[str] = set()
    for ops in info.item_ops:
        for op in ops:
            if any(pred in pos and pred not in seen for pred in info.model.preds[op]):
                return False
            seen.add(op)
    return True


def _recv_rects(info: ChainInfo, pos: dict[str, int]) -> list[Rect]:
    """Per producer p and per item c holding a consumer: the starts i after p (or any, p outside the
    chain) whose first consumer item is c receive p in every [i, j) with j > c."""
    model, last = info.model, info.num_items
    consumers: dict[str, set[int]] = {}
    for op, idx in pos.items():
        for pred in model.preds[op]:
            consumers.setdefault(pred, set()).add(idx)
    rects: list[Rect] = []
    for producer, items in consumers.items():
        low = pos.get(producer, -1)
        for item in sorted(items):
            if item > low:
                rects.append((low + 1, item, item + 1, last, model.out_bytes_per_sample[producer]))
                low = item
    return rects


def _send_rects(info: ChainInfo, pos: dict[str, int]) -> list[Rect]:
    """An op at item q with a consumer after item q is sent by every [i, j) with i <= q < j <= its
    last consumer's item (any j when a consumer is outside the chain)."""
    model, last = info.model, info.num_items
    rects: list[Rect] = []
    for op, idx in pos.items():
        succs = model.succs[op]
        if not succs:
            continue
        reach = max(pos.get(succ, last) for succ in succs)
        if reach > idx:
            rects.append((0, idx, idx + 1, reach, model.out_bytes_per_sample[op]))
    return rects


def exact_sums(weights: list[float], times: int = 4) -> bool:
    """Every sum of +-weights, each counted up to `times` times (by default 4: a rectangle's corners), is exact in
    floating point."""
    if not all(math.isfinite(weight) for weight in weights):
        return False
    ratios = [abs(weight).as_integer_ratio() for weight in weights]  # denominators are powers of 2
    scale = max((den for _, den in ratios), default=1)
    return times * sum(num * (scale // den) for num, den in ratios) < 1 << 53


class ParInfo:
    """Branch order and merged-group costs of one parallel block.

    Branches are sorted by compute (at the largest profiled batch), heaviest first; a group of branches
    is a bit mask over that order. With more than MAX_ENUMERATED_BRANCHES branches only groups of
    consecutive sorted branches (interval partitions) are tried, which keeps the DP polynomial."""

    def __init__(self, model: CostModel, par: SPParallel, branch_infos: Sequence[ChainInfo], index: int = -1) -> None:
        """`branch_infos`: the branches' tables in `par.branches` order; `index`: the DP's memo key."""
        self.par = par
        self.index = index
        ref = max(model.costs.micro_batch_sizes, default=1)
        weight = [sum(sum(model.op_at(op, ref)[:2]) for op in branch.ops) for branch in par.branches]
        self.order = sorted(range(len(par.branches)), key=lambda r: -weight[r])
        self.branch_infos = [branch_infos[r] for r in self.order]
        self.model = model
        self.interval = len(par.branches) > MAX_ENUMERATED_BRANCHES
        self._groups: dict[int, tuple[int, int, float]] = {}
        self._group_ops: dict[int, tuple[str, ...]] = {}
        self._boundaries: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        self._joined: dict[tuple[int, tuple[str, ...]], tuple[tuple[str, ...], int, int, float]] = {}
        self._run_traffic: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # per join run, a merge stage's traffic on every pair of tails (`merge_boundary.merge_boundary`), for every size
        self.merge_boundaries: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}

    def group_ops(self, mask: int) -> tuple[str, ...]:
        """The ops of the branches in `mask`, in branch order (built only for the stages a plan has, and a join's)."""
        hit = self._group_ops.get(mask)
        if hit is None:
            top = 1 << (mask.bit_length() - 1)
            top_ops = self.branch_infos[mask.bit_length() - 1].chain.ops
            hit = self._group_ops[mask] = top_ops if mask == top else self.group_ops(mask ^ top) + top_ops
        return hit

    def group_costs(self, mask: int) -> tuple[int, int, float]:
        """(param bytes, messages, bytes per sample) of the branches in `mask` as one stage; cached."""
        hit = self._groups.get(mask)
        if hit is None:
            top = 1 << (mask.bit_length() - 1)
            if mask == top:
                params = sum(self.model.param_bytes[op] for op in self.branch_infos[mask.bit_length() - 1].chain.ops)
            else:
                params = self.group_costs(mask ^ top)[0] + self.group_costs(top)[0]
            messages, num_bytes = self.model.crossing(*self._sides(mask))
            hit = self._groups[mask] = (params, messages, num_bytes)
        return hit

    def run_traffic(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(param bytes, messages, bytes per sample) of every run [g, s) of sorted branches as one stage
        (`group_costs`), as (n + 1) x (n + 1) arrays (0 where s < g + 2); cached (every size reads the same)."""
        if self._run_traffic is None:
            size = len(self.branch_infos) + 1
            params, messages = np.zeros((size, size), dtype=np.int64), np.zeros((size, size), dtype=np.int64)
            num_bytes = np.zeros((size, size))
            for start in range(size - 2):
                for stop in range(start + 2, size):
                    params[start, stop], messages[start, stop], num_bytes[start, stop] = \
                        self.group_costs((1 << stop) - (1 << start))
            self._run_traffic = (params, messages, num_bytes)
        return self._run_traffic

    def _sides(self, mask: int) -> tuple[frozenset[str], frozenset[str]]:
        """(received, sent) tensors of the branches in `mask` as one stage: the unions of the branches' own,
        as no edge joins two branches of a block (`CostModel.boundary_sides`, grown a branch at a time)."""
        hit = self._boundaries.get(mask)
        if hit is None:
            top = 1 << (mask.bit_length() - 1)
            if mask == top:
                hit = self.model.boundary_sides(self.branch_infos[mask.bit_length() - 1].chain.ops)
            else:
                (recv, send), (top_recv, top_send) = self._sides(mask ^ top), self._sides(top)
                hit = (recv | top_recv, send | top_send)
            self._boundaries[mask] = hit
        return hit

    def groups_of(self, mask: int) -> Iterator[int]:
        """Groups that contain the lowest branch of `mask`: every subset (for a block of up to
        MAX_ENUMERATED_BRANCHES branches; a wider block groups runs of sorted branches only: `runs`)."""
        low = mask & -mask
        rest = mask ^ low
        sub = rest
        while True:
            yield sub | low
            if not sub:
                return
            sub = (sub - 1) & rest

    def join_groups(self) -> range:
        """The groups a join run's stage may take whole (`Probe.joined`): with runs (`interval`), the runs that end
        the sorted order (the lightest branches) and leave at least one branch out, as the start of the run."""
        return range(1, len(self.par.branches)) if self.interval else range(0)

    def with_join(self, start: int, join_ops: tuple[str, ...]) -> tuple[tuple[str, ...], int, int, float]:
        """(ops, param bytes, messages, bytes per sample) of the sorted branches from `start` on and the join run
        as one stage; cached (every size reads the same)."""
        key = (start, join_ops)
        hit = self._joined.get(key)
        if hit is None:
            lightest = self.lightest_from(start)
            ops = self.group_ops(lightest) + join_ops
            params = self.group_costs(lightest)[0] + sum(self.model.param_bytes[op] for op in join_ops)
            hit = self._joined[key] = (ops, params, *self.model.boundary(ops))
        return hit

    def lightest_from(self, start: int) -> int:
        """The bit mask of the sorted branches from `start` on (the lightest ones)."""
        return (1 << len(self.branch_infos)) - (1 << start)

    def merge_ops(self, join_ops: tuple[str, ...], s0: int, s1: int) -> tuple[str, ...]:
        """Ops of a merge stage: the tails of both (sorted) branches from items s0 and s1, then the join run."""
        first, second = self.branch_infos
        return first.ops(s0, first.num_items) + second.ops(s1, second.num_items) + join_ops


BlockKey = tuple[int, tuple[str, ...], tuple[str, ...]]  # (parallel block's index, fork ops, join ops)


@dataclass(frozen=True, slots=True)
class Block:
    """A fork/join block (`blocks.ForkJoin`) as the DP sees it: positions in its chain, its parallel block's
    tables and its content keys.

    What the DP finds for a block depends on its parallel block and the ops of its fork and join runs
    only, not on the chain it sits in nor on the positions: `key` (with the join, `key_alone` without),
    so the same block met in a branch and in the branch's extended chains is solved once."""

    pinfo: ParInfo
    fork: SPLeaf | None
    join: SPLeaf | None
    par_pos: int
    stop: int
    key: BlockKey
    key_alone: BlockKey  # the join left out (a block without J)

    @staticmethod
    def of(items: ForkJoin, pinfo: ParInfo | None) -> Block:
        assert pinfo is not None, "a chain's fork/join blocks need its parallel blocks' tables (`ChainTables`)"
        return Block(pinfo=pinfo, fork=items.fork, join=items.join, par_pos=items.par_pos, stop=items.stop,
                     key=(pinfo.index, items.fork_ops, items.join_ops), key_alone=(pinfo.index, items.fork_ops, ()))

    @property
    def num_branches(self) -> int:
        return len(self.pinfo.par.branches)


ExtendedKey = tuple[int, int, tuple[str, ...], tuple[str, ...]]  # (parallel block, sorted branch, fork ops, join ops)


class ChainTables:
    """Every chain's and parallel block's tables of one SP tree, by index, shared by all sizes and probes.

    Built bottom-up from the tree (a chain after the parallel blocks in it, a block after its branches;
    `root` is the tree's chain). The extended chains of fork/join absorption are added when the DP
    first asks for one (`extended`), each once per content: blocks of the same content in different
    chains share them. `len` counts the chains, extended ones included (the DP's table work)."""

    def __init__(self, model: CostModel, tree: SPChain) -> None:
        self.model = model
        self.pars: list[ParInfo] = []
        self._chains: list[ChainInfo] = []
        self._extended: dict[ExtendedKey, ChainInfo] = {}
        self._by_shape: dict[tuple[int, ...], list[ChainInfo]] = {}  # chains without twins, by ops per item
        self._wirings: dict[int, tuple[object, ...]] = {}  # by chain index, made only where shapes meet
        self.root = self._add_tree(tree)

    def __len__(self) -> int:
        return len(self._chains)

    def __iter__(self) -> Iterator[ChainInfo]:
        return iter(self._chains)

    def __getitem__(self, index: int) -> ChainInfo:
        return self._chains[index]

    def _add_tree(self, chain: SPChain) -> ChainInfo:
        pars = [self._add_par(item) if isinstance(item, SPParallel) else None for item in chain.items]
        return self._add(chain, pars)

    def _add_par(self, par: SPParallel) -> ParInfo:
        pinfo = ParInfo(self.model, par, [self._add_tree(branch) for branch in par.branches], len(self.pars))
        self.pars.append(pinfo)
        return pinfo

    def _add(self, chain: SPChain, par_infos: Sequence[ParInfo | None]) -> ChainInfo:
        info = ChainInfo(self.model, chain, len(self._chains), par_infos)
        self._chains.append(info)
        twin = self.twin_of(info)
        if twin is not None:
            info.share_with(twin)
        return info

    def twin_of(self, info: ChainInfo) -> ChainInfo | None:
        """An earlier chain the DP cannot tell from `info`, or None: both without parallel items and with the
        same wiring (`ChainInfo.wiring`: costs, weights, output sizes and edges, so the same costs and traffic
        for every segment; where a sum of bytes could round, the boundary matrices themselves are compared).
        Its segment tables are then the same numbers, and so are its rows in any probe: the identical
        branches of a block (one encoder per modality, one MLP per feature) are tabled and solved once."""
        if info.has_parallel:
            return None
        same = self._by_shape.setdefault(tuple(len(ops) for ops in info.item_ops), [])
        for twin in same:  # equal wiring needs as many ops in each item: a chain of its own shape is not wired
            if self._wiring(twin) == self._wiring(info) and (info.exact_traffic() or self._same_traffic(info, twin)):
                return twin
        same.append(info)
        return None

    @staticmethod
    def _same_traffic(info: ChainInfo, twin: ChainInfo) -> bool:
        return all(np.array_equal(mine, theirs) for mine, theirs in zip(info.boundary_matrix(), twin.boundary_matrix()))

    def _wiring(self, info: ChainInfo) -> tuple[object, ...]:
        found = self._wirings.get(info.index)
        if found is None:
            found = self._wirings[info.index] = info.wiring()
        return found

    def extended(self, block: Block, pos: int, with_fork: bool, with_join: bool) -> ChainInfo:
        """Branch at sorted position `pos` of the block with the fork run prepended and/or the join run appended
        (the branch itself with neither)."""
        fork = block.fork if with_fork else None
        join = block.join if with_join else None
        branch = block.pinfo.branch_infos[pos]
        if not fork and not join:
            return branch
        key = (block.pinfo.index, pos, fork.ops if fork else (), join.ops if join else ())
        hit = self._extended.get(key)
        if hit is None:
            items = ((fork,) if fork else ()) + branch.chain.items + ((join,) if join else ())
            pars = ((None,) if fork else ()) + branch.par_infos + ((None,) if join else ())
            hit = self._extended[key] = self._add(SPChain(items=items), pars)
            if not fork:
                hit.prefix_of = branch  # the branch with J appended: its floors extend the branch's
        return hit


def build_tables(model: CostModel, tree: SPChain) -> tuple[ChainTables, list[ParInfo]]:
    """Chain and parallel-block tables of the tree, shared by every micro-batch size and probe."""
    chains = ChainTables(model, tree)
    return chains, chains.pars
