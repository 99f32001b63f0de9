"""Merge stages of two-branch blocks, every pair of tails at once, and the floors that prune them.

A merge stage M (`fork_join`) takes a block's join run J and the tails [s_0, n_0) and [s_1, n_1)
of both branches. Trying every pair of tails one by one cost a Python loop per pair and probe,
and a prefix solve of each branch per tail (`Probe.chain(..., end=s)`), although almost no pair
betters the block's vector: on the op-level case study, 3 pairs of 22,528 did. Here tails are
numbered t = n - 1 - s (shortest first, the order the DP tries them) and everything is a numpy
matrix over the pairs (t_0, t_1):

- `merge_boundary` (its own module): M's traffic, messages and bytes per sample, on every pair.
- `MergeTable` (one size): M's TPS and most micro-batches in flight per degree and pair, then,
  per probe, the tails that meet the target and fit alone (`fork_join`'s docstring) and M's
  fewest devices on every pair (`MergeTable.devices`).
- `prefix_floors`: a lower bound of the need vector of every prefix [0, s) of a lane's chain
  followed by k in flight, every prefix at once, one stage count at a time: the chain DP with every
  stage holding just k + 1 (each really holds k + 1 or more, as many more as stages follow it),

      floor[0][m] = 0,   floor[j][m] = min over segments [i, j) within the target that hold
                                        k + 1 micro-batches of floor[i][m - 1] + its fewest degree

  settled non-increasing in m, so that floor[s][v - k] <= need_0[v] (the prefix holds k plus its
  stages at its entry); equal where memory does not limit the in-flight counts. A chain with
  parallel items also steps over each parallel item or fork/join block as one stage on at least
  its least work over the target (`block_steps`).

- `PrefixNeeds`: the need vectors themselves, of every prefix of a chain without parallel items
  and for every k, built only where many layouts pass their floors. Where no segment within the
  target has a fewest degree that depends on its in-flight count (memory lets a stage that holds
  one micro-batch hold every count), they are the prefix floors: a stage then costs the same
  whatever it holds. Else `prefix_needs`, one forward pass over every entry count at once, whose
  table grows with the square of the devices.

`ForkJoinSolver` adds the floors of a layout's lanes to M's devices and solves exactly only the
layouts whose floor betters a cell of the block's vector; where that leaves many, it reads the
lanes' needs from `PrefixNeeds` and writes the block's vector from all pairs at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from graphpipe.cost.formulas.communication import p2p_ms_array
from graphpipe.cost.formulas.memory import OPTIMIZER_STATE_FACTOR, max_in_flight_micro_batches_array
from graphpipe.cost.formulas.time_per_sample import optimizer_step_ms_array, time_per_sample_ms_array
from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.merge_boundary import merge_boundary
from graphpipe.planner.sp_dp.size_tables import SizeTables, fewest_within, least_by_degree
from graphpipe.planner.sp_dp.tables import ChainInfo, ParInfo


class MergeTable:
    """One micro-batch size's merge stages of one block (its parallel block `pinfo` and join run): per tail,
    the compute and static memory that `fork_join` tests alone, and per degree and pair of tails, M's TPS
    and most micro-batches in flight (built for as many tails as a probe asks, and rebuilt larger when a
    looser target asks for more)."""

    def __init__(self, tables: SizeTables, pinfo: ParInfo, join_ops: tuple[str, ...]) -> None:
        self.tables = tables
        self.pinfo = pinfo
        self.join_ops = join_ops
        b, widest, model = tables.micro_batch_size, tables.degrees[-1], tables.model
        join_ms = model.group_at(join_ops, b / widest)[0] / 2
        join_params = sum(model.param_bytes[op] for op in join_ops) / 2
        self.starts: list[np.ndarray] = []
        self.compute: list[np.ndarray] = []  # per tail: compute per sample on the widest degree, with J's half
        self.params: list[np.ndarray] = []  # per tail: weights, gradients and optimizer state, with J's half
        for info in pinfo.branch_infos:
            end = info.num_items
            starts = np.arange(end - 1, -1, -1)
            times = np.array(info.prefix_at(b / widest)[0])
            self.starts.append(starts)
            self.compute.append((times[end] - times[starts]) / b + join_ms / b)
            weights = np.array(info.param_prefix, dtype=float)
            self.params.append(OPTIMIZER_STATE_FACTOR * (weights[end] - weights[starts] + join_params))
        self._tps = self._k_max = np.zeros((0, 0, 0))
        self._least_by_count: dict[int, np.ndarray] = {}  # see `_least`

    def devices(self, target_ms: float, k_side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(starts s_0, starts s_1, fewest devices of M per pair or BIG) of the tails that meet the target and
        fit alone, M on the fewest degree that meets the target and holds k_side micro-batches; pairs whose
        tails together miss the target or the memory get BIG (with either tail longer, they only cost more)."""
        limit = self.tables.memory_limit
        alone = [np.logical_and.accumulate((compute <= target_ms) & (params <= limit))
                 for compute, params in zip(self.compute, self.params)]
        count0, count1 = (int(np.count_nonzero(ok)) for ok in alone)
        if not count0 or not count1:
            return None
        pair = self.compute[0][:count0, None] + self.compute[1][None, :count1] <= target_ms
        pair &= self.params[0][:count0, None] + self.params[1][None, :count1] <= limit
        pair = np.logical_and.accumulate(pair, axis=1)
        fewest = fewest_within(self._least(count0, count1, k_side)[:, :count0, :count1], target_ms, self.tables.degrees)
        fewest[~pair] = BIG
        return self.starts[0][:count0], self.starts[1][:count1], fewest

    def _least(self, count0: int, count1: int, k_side: int) -> np.ndarray:
        """`size_tables.least_by_degree` of M's TPS where it holds k_side, per degree and pair; kept per k_side
        until the table grows (`_costs`)."""
        tps, k_max = self._costs(count0, count1)
        least = self._least_by_count.get(k_side)
        if least is None:
            least = self._least_by_count[k_side] = least_by_degree(tps, k_max >= k_side)
        return least

    def _costs(self, count0: int, count1: int) -> tuple[np.ndarray, np.ndarray]:
        """(TPS, most in flight) of M per degree and pair, the rule's twins as the segment tables call them."""
        if self._tps.shape[1] < count0 or self._tps.shape[2] < count1:
            count0, count1 = max(count0, self._tps.shape[1]), max(count1, self._tps.shape[2])
            self._tps, self._k_max = self._build(count0, count1)
            self._least_by_count.clear()
        return self._tps, self._k_max

    def _build(self, count0: int, count1: int) -> tuple[np.ndarray, np.ndarray]:
        tables, model = self.tables, self.tables.model
        b = tables.micro_batch_size
        first, second = self.pinfo.branch_infos
        starts0, starts1 = self.starts[0][:count0], self.starts[1][:count1]
        messages, num_bytes = (part[:count0, :count1] for part in merge_boundary(self.pinfo, self.join_ops))
        weights = [np.array(info.param_prefix, dtype=float) for info in (first, second)]
        params = (weights[0][-1] - weights[0][starts0])[:, None] + (weights[1][-1] - weights[1][starts1])[None, :]
        params += sum(model.param_bytes[op] for op in self.join_ops)
        shape = (len(tables.degrees), count0, count1)
        tps, k_max = np.empty(shape), np.empty(shape, dtype=np.int64)
        step = optimizer_step_ms_array(model.device, params)
        for pos, d1 in enumerate(tables.degrees):  # a degree at a time: a long pair of towers makes large planes
            per_device = b / d1
            (times0, acts0), (times1, acts1) = first.prefix_arrays(per_device), second.prefix_arrays(per_device)
            join_ms, join_act = model.group_at(self.join_ops, per_device)
            compute = (times0[-1] - times0[starts0])[:, None] + (times1[-1] - times1[starts1])[None, :] + join_ms
            comm = p2p_ms_array(model.link, messages, num_bytes * per_device)
            per_iteration = model.per_iteration_array(params, d1, step)
            tps[pos] = time_per_sample_ms_array(model.device, compute, comm, per_iteration, b)
            acts = (acts0[-1] - acts0[starts0])[:, None] + (acts1[-1] - acts1[starts1])[None, :] + join_act
            k_max[pos] = max_in_flight_micro_batches_array(params, acts, tables.memory_limit,
                                                           tables.num_micro_batches, tables.max_v + 1)
        return tps, k_max


Step = tuple[int, int]  # (stop, devices): a staging of items [start, stop) in one stage or more, on at least these


SPARSE_SHARE = 0.25  # `prefix_floors` reads the segments by stop where they are at most this share of starts x stops


def prefix_floors(fewest: np.ndarray, max_v: int, steps: dict[int, list[Step]] | None = None) -> np.ndarray:
    """floor[s, m]: fewest devices staging items [0, s) in at most m stages, from `fewest[i, j]` (the fewest
    degree on which segment [i, j) meets the target and holds what it must, BIG where none does) and, for a
    chain with parallel items, `steps` (`block_steps`: each block as one stage on its least work); see the
    module docstring. Values above BIG are clipped to BIG.

    One min-plus product per stage count: column m is column m - 1 or a stage [i, s) after a staging of
    [0, i) in m - 1; once a column repeats, all later ones do. Where few segments meet the target (a long
    chain at a tight target: a start reaches a few stops), a column reads only those, grouped by stop (one
    gather and one `minimum.reduceat`); else it reads every live start against every stop. Columns are
    built as contiguous rows and turned at the end."""
    size = fewest.shape[0]
    edges = np.where(np.triu(np.ones((size, size), dtype=bool), 1), fewest, BIG).astype(np.int64)
    for start, reach in (steps or {}).items():
        for stop, devices in reach:
            edges[start, stop] = min(int(edges[start, stop]), devices)
    live = np.flatnonzero(edges.min(axis=1) < BIG)  # the starts some stage leaves from
    sparse = np.count_nonzero(edges < BIG) <= SPARSE_SHARE * live.size * size
    stage = _sparse_stage(edges) if sparse else _dense_stage(edges[live], live)
    columns = np.full((max_v + 1, size), BIG, dtype=np.int64)
    columns[0, 0] = 0
    for m in range(1, max_v + 1):
        before, column = columns[m - 1], columns[m]
        stage(before, column)
        if np.array_equal(column, before):
            columns[m + 1:] = column
            break
    return np.ascontiguousarray(columns.T)


Stage = Callable[[np.ndarray, np.ndarray], None]  # `prefix_floors`' step: writes column m from column m - 1


def _dense_stage(edges: np.ndarray, live: np.ndarray) -> Stage:
    """The step over every live start (the rows of `edges`) against every stop, clipped to BIG."""
    def stage(before: np.ndarray, column: np.ndarray) -> None:
        np.minimum(before, np.minimum((before[live, None] + edges).min(axis=0, initial=BIG), BIG), out=column)

    return stage


def _sparse_stage(edges: np.ndarray) -> Stage:
    """The step over the segments within reach only: column[s] = min(before[s], before[i] + the segment [i, s)'s
    devices) over the segments that end at s (clipped to BIG)."""
    stops, starts = np.nonzero(edges.T < BIG)  # by stop, then start
    weights = edges[starts, stops]
    targets, first = np.unique(stops, return_index=True)

    def stage(before: np.ndarray, column: np.ndarray) -> None:
        column[:] = before
        if targets.size:
            reached = np.minimum.reduceat(before[starts] + weights, first)
            column[targets] = np.minimum(column[targets], np.minimum(reached, BIG))

    return stage


def held_floors(tables: SizeTables, info: ChainInfo, target_ms: float, held: int,
                steps: dict[int, list[Step]] | None = None) -> np.ndarray:
    """`prefix_floors` of the chain with every stage holding `held` micro-batches, from its whole segment table
    (`steps`: its parallel items and blocks, `block_steps`, where it has any)."""
    return prefix_floors(tables.fewest_degrees(info, target_ms, np.array([held]))[0], tables.max_v, steps)


def block_steps(tables: SizeTables, info: ChainInfo, target_ms: float) -> dict[int, list[Step]]:
    """Per start, what else than a segment the chain DP may stage from there (`Probe._solve_chain`): its parallel
    item opened (up to the next item) and the fork/join blocks starting there (up to the block's parallel item
    or its join run's end). Each takes at least one stage, and at least one device and its least work over
    the target T: a stage on d devices meets T only if d x its compute at b / d samples per device is at most
    d x T x b, and its items cost at least their least such work over the degrees, so

        devices >= sum over items of min over d of d x compute(item, b / d), over T x b."""
    b = tables.micro_batch_size
    per_item = np.min([d1 * np.diff(info.prefix_arrays(b / d1)[0]) for d1 in tables.degrees], axis=0)
    work = np.concatenate(([0.0], np.cumsum(per_item)))

    def least(start: int, stop: int) -> int:
        if target_ms == math.inf:
            return 1  # a hair below the quotient: rounding must not lift a floor above the need
        return max(1, math.ceil(float(work[stop] - work[start]) / (target_ms * b) * (1 - 1e-9)))

    steps: dict[int, list[Step]] = {}
    for start in range(info.num_items):
        stops = {start + 1} if info.par_infos[start] is not None else set()
        block = info.fork_join(start)
        if block is not None:
            stops |= {block.par_pos + 1, block.stop}
        if stops:
            steps[start] = [(stop, least(start, stop)) for stop in sorted(stops)]
    return steps


def shifted(floors: np.ndarray, ends: np.ndarray, k_after: int, cells: int | None = None) -> np.ndarray:
    """Per end e, the floor of prefix [0, e)'s need vector given k_after after it: floors[e, v - k_after]
    (BIG for v < k_after: nothing holds fewer than what follows it), for v below `cells` (by default as many as
    the floors have stage counts; else the floors must have at least cells - k_after)."""
    cells = floors.shape[1] if cells is None else cells
    out = np.full((len(ends), cells), BIG, dtype=np.int64)
    if k_after < cells:
        out[:, k_after:] = floors[ends, :cells - k_after]
    return out


EXACT_CELLS = 1 << 21  # `prefix_needs` where its table (in-flight counts squared x items) is at most this


def prefix_needs(fewest: np.ndarray) -> np.ndarray:
    """held[e, s, w]: fewest devices staging items [0, s) of a chain without parallel items so that its first
    stage holds e micro-batches in flight, each next stage one fewer, and what follows holds w, from
    `fewest[w, i, j]` (the fewest degree on which segment [i, j) meets the target and holds its weights and w
    micro-batches, BIG where none does). Forward over the starts, every entry count at once:

        held[e, 0, e] = 0,   held[e, j, w - 1] = min over i < j of held[e, i, w] + fewest[w, i, j]

    The chain DP's need vector of prefix [0, s) followed by k is min over e <= v of held[e, s, k]
    (`needs_after`): a stage n stages from the end holds exactly k + n there (`Probe._solve_chain`), so
    these are its numbers, for every prefix and every k at once."""
    counts, size = fewest.shape[0], fewest.shape[1]
    held = np.full((counts, size, counts), BIG, dtype=np.int64)
    held[np.arange(counts), 0, np.arange(counts)] = 0
    for start in range(size - 1):
        row = held[:, start, 1:]  # the stage from `start` holds w = 1 ..
        if row.min() >= BIG:
            continue
        reach = fewest[1:, start, start + 1:]  # (w, stop)
        stops = np.flatnonzero(reach.min(axis=0) < BIG)
        if stops.size:
            reached = np.minimum(row[:, None, :] + reach[:, stops].T[None, :, :], BIG)
            ends = stops + start + 1
            held[:, ends, :-1] = np.minimum(held[:, ends, :-1], reached)
    return held


def needs_after(held: np.ndarray, k_after: int, num_devices: int) -> np.ndarray:
    """Per end s, the need vector of prefix [0, s) followed by k_after in flight (`prefix_needs`)."""
    if k_after >= held.shape[2]:
        return np.full((held.shape[1], held.shape[0]), BIG, dtype=np.int64)
    needs = np.minimum.accumulate(held[:, :, k_after], axis=0).T
    needs[needs > num_devices] = BIG
    return np.ascontiguousarray(needs)


class PrefixNeeds:
    """The need vectors of every prefix of a chain without parallel items, for every k_after (`after`).

    Where each segment within the target has one fewest degree whatever it holds from one micro-batch to every
    in-flight count (memory never stops a stage that holds one from holding them all, as with a single
    micro-batch per mini-batch), `prefix_floors` are exact: a stage's devices do not depend on its count, so
    the least staging of [0, s) in at most v - k stages is the need at v. They cost one column per count
    instead of `prefix_needs`' square of the counts, which is built otherwise."""

    def __init__(self, held: np.ndarray | None = None, floors: np.ndarray | None = None) -> None:
        self.held = held
        self.floors = floors

    @classmethod
    def of(cls, tables: SizeTables, info: ChainInfo, target_ms: float,
           free_floors: np.ndarray | None) -> PrefixNeeds | None:
        """From the chain's count-free floors where it has them (`ForkJoinSolver.free_floors`, None where the counts
        matter), else from `prefix_needs`; None where that table would exceed EXACT_CELLS."""
        if free_floors is not None:
            return cls(floors=free_floors)
        counts = tables.max_v + 1
        if counts * counts * (info.num_items + 1) > EXACT_CELLS:
            return None
        return cls(held=prefix_needs(tables.fewest_degrees(info, target_ms, np.arange(counts))))

    def after(self, k_after: int, num_devices: int) -> np.ndarray:
        """Per end s, the need vector of prefix [0, s) followed by k_after in flight."""
        if self.held is not None:
            return needs_after(self.held, k_after, num_devices)
        assert self.floors is not None
        return floor_needs(self.floors, np.arange(self.floors.shape[0]), k_after, num_devices)


def extend_floors(floors: np.ndarray, last: np.ndarray) -> np.ndarray:
    """`prefix_floors` of a chain with one item appended, from the chain's own (`floors`, for every prefix of it) and
    the fewest degree of each segment that ends with the new item (`last[i]` for [i, L + 1)): the new row at m stages
    is the least of the row at m - 1 and of a last stage [i, L + 1) after a staging of [0, i) in m - 1."""
    reached = np.minimum((floors[:, :-1] + last[:, None]).min(axis=0), BIG)
    row = np.minimum.accumulate(np.concatenate(([BIG], reached)))
    return np.vstack((floors, row[None, :]))


def suffix_floors(fewest: np.ndarray, end: int, max_v: int) -> np.ndarray:
    """floor[s, m]: fewest devices staging items [s, end) in at most m stages, for s = 0 .. end: `prefix_floors` of
    the chain [0, end) read backwards (segment [i, j) of it is [end - j, end - i) of the reversed one)."""
    part = fewest[:end + 1, :end + 1]
    return np.ascontiguousarray(prefix_floors(part[::-1, ::-1].T, max_v)[::-1])


def floor_needs(floors: np.ndarray, ends: np.ndarray, k_after: int, num_devices: int,
                cells: int | None = None) -> np.ndarray:
    """Per end, the need vector of prefix [0, end) followed by k_after in flight, from count-free floors (which
    are then the needs, `PrefixNeeds`): the floor at v - k_after, infeasible above the devices (`cells`: as in
    `shifted`)."""
    needs = shifted(floors, ends, k_after, cells)
    needs[needs > num_devices] = BIG
    return needs


class MergeTables:
    """The `MergeTable`s of one micro-batch size, by block (parallel block and join run): owned by its `Search`,
    shared by its probes."""

    def __init__(self, tables: SizeTables) -> None:
        self.tables = tables
        self._tables: dict[tuple[int, tuple[str, ...]], MergeTable] = {}

    def of(self, pinfo: ParInfo, join_ops: tuple[str, ...]) -> MergeTable:
        key = (pinfo.index, join_ops)
        hit = self._tables.get(key)
        if hit is None:
            hit = self._tables[key] = MergeTable(self.tables, pinfo, join_ops)
        return hit
