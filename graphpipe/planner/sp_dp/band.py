"""A chain's segments within a TPS target as a band: their fewest degrees and the least staging over them,
without the chain's whole segment table.

A segment's TPS is at least the rule's TPS without its p2p term (`time_per_sample_floor`: compute, actions,
all-reduce and optimizer step), which only grows with the stop, so from each start only the stops up to the
last where they are within the target on a degree can meet it on that degree: W_d stops per start on degree d,
far fewer than the chain's length on a long chain and a tight target (a long segment meets a target only on
many devices, and on many its weights' all-reduce is long). `Band` evaluates the segment table's formulas
(`SizeTables.segment_costs`, shared with the table) on each degree's band only, so every number is the
table's;
`least_staging_in_band` is the least staging over those segments (the others meet nothing), which
`merge_tails.prefix_floors` reaches at its last stage count wherever it fits on the devices. The chain
pass reads it (`Search.may_meet`, through `chain_floor`): at op level on many devices, building the
whole table of every micro-batch size was most of its time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphpipe.cost.formulas.communication import ring_all_reduce_line
from graphpipe.cost.formulas.time_per_sample import optimizer_step_ms_array, time_per_sample_floor
from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.merge_tails import block_steps, held_floors
from graphpipe.planner.sp_dp.size_tables import SegmentOffers, SizeTables, dominance_cap, fewest_degree
from graphpipe.planner.sp_dp.tables import ChainInfo
from graphpipe.planner.stage_cost import all_reduce_link

MARGIN = 1e-6  # relative, on the band's edge: a segment the rounding might let in is kept and evaluated
NARROW = 0.5  # the largest band, as a share of the segment table's cells, read as a band (`chain_floor`)
PASS_CELLS = 4000  # numpy's fixed work in one pass of `Band`'s evaluation, in cells (measured: about 50 us a pass)


def band_widths(tables: SizeTables, info: ChainInfo, target_ms: float) -> list[int]:
    """Per degree, the stops per start that may hold a segment within `target_ms` on it: the most, over starts, up
    to the last stop whose TPS without its p2p term on that degree is within it (with a margin; the chain's
    length for no target). Both only grow with the stop, so each start's stops within are a
    prefix, found by binary searches on prefix sums (`_reach`). Wider degrees reach further on compute, less far
    on the all-reduce: a long segment needs many devices, and its weights' all-reduce grows with them."""
    size = info.num_items + 1
    return [min(max(1, int((_reach(tables, info, target_ms, d1) - 1 - np.arange(size)).max())), max(1, size - 1))
            for d1 in tables.degrees]


def _reach(tables: SizeTables, info: ChainInfo, target_ms: float, d1: int) -> np.ndarray:
    """Per start i, the first stop j whose segment [i, j) is beyond `target_ms` on d1 devices by the rule's TPS
    without its p2p term (`time_per_sample_floor`): its compute per sample (times[j] - times[i]) / b, the fixed
    terms of any stage, and a line in its weights P[j] - P[i] (all-reduce and step), with the all-reduce's fixed term
    where they are positive (`ring_all_reduce_line`): a stop with no new weights is beyond only by its compute and
    the fixed terms, past those by key[j] = times[j] / b + slope x P[j] against key[i] + target - fixed, both
    non-decreasing in j. The TPS adds the p2p time to these, so no segment from there on meets the target."""
    b, model = tables.micro_batch_size, tables.model
    times = info.prefix_arrays(b / d1)[0]
    any_fixed, slope, weighted_fixed = time_per_sample_floor(
        model.device, ring_all_reduce_line(all_reduce_link(model.cluster, d1), d1), b, tables.global_batch_size)
    room = target_ms * (1 + MARGIN) - any_fixed
    computed = np.searchsorted(times, times + room * b + MARGIN * abs(float(times[-1])), side="right")
    if slope == 0.0 and weighted_fixed == 0.0:
        return computed
    weights = info.param_array
    key = times / b + weights * slope
    limit = key + (room - weighted_fixed) + MARGIN * abs(float(key[-1]))
    reduced = np.searchsorted(key, limit, side="right")  # the first stop beyond, counting the all-reduce
    unweighted = np.searchsorted(weights, weights, side="right")  # the first stop with new weights
    return np.where(reduced > unweighted, reduced, np.minimum(computed, unweighted))


def chain_band(tables: SizeTables, info: ChainInfo, target_ms: float) -> Band | None:
    """The chain's segments within `target_ms` as a band (`Band`), or None where the chain has parallel items or the
    band would hold more than NARROW of the table's cells (gathering a wide band costs more than the table, which a
    probe at this target builds anyway)."""
    if info.has_parallel:
        return None
    widths = band_widths(tables, info, target_ms)
    if sum(widths) > NARROW * len(widths) * info.num_items:
        return None
    return Band(tables, info, target_ms, widths)


def chain_floor(tables: SizeTables, info: ChainInfo, target_ms: float, band: Band | None) -> int:
    """A floor on the devices that stage the chain at this target with every stage holding one micro-batch, at most
    the devices exactly when some such staging fits on them (`Search.may_meet`): the least over any number of
    stages over its `band` (`chain_band`, `least_staging_in_band`) where it has one; else
    `merge_tails.prefix_floors` at `max_v` stages from the whole table, its blocks stepped over on their least work.
    The two agree on that test: a staging on at most the devices has at most as many stages, fewer than `max_v`."""
    if band is not None:
        return least_staging_in_band(band.fewest())
    steps = block_steps(tables, info, target_ms) if info.has_parallel else None
    return int(held_floors(tables, info, target_ms, 1, steps)[-1, -1])


@dataclass(frozen=True, slots=True)
class BandGroup:
    """Consecutive degrees of the table (from position `first`) evaluated on one band of `width` stops per start:
    TPS, most micro-batches in flight and fits, degree x start x w for segment [start, start + 1 + w)."""

    first: int
    degrees: tuple[int, ...]
    width: int
    tps: np.ndarray
    k_max: np.ndarray
    fits: np.ndarray


class Band:
    """A chain's segments that may meet `target_ms`, on each degree's band (`band_widths`, grouped by
    `_band_groups`), with the segment table's numbers (`SizeTables.segment_costs` on the band only). Read for the
    floor (`fewest`) and, at that target alone, for the offers of a probe (`offers`): the chain pass's probe at
    the ceiling then builds no segment table."""

    def __init__(self, tables: SizeTables, info: ChainInfo, target_ms: float, widths: list[int]) -> None:
        self.tables = tables
        self.info = info
        self.target = target_ms
        self.width = max(widths)
        self.groups: list[BandGroup] = []
        first = 0
        for degrees, width in _band_groups(tables.degrees, widths, info.num_items + 1):
            self.groups.append(self._group(first, degrees, width))
            first += len(degrees)

    def _group(self, first: int, degrees: tuple[int, ...], width: int) -> BandGroup:
        tables, info = self.tables, self.info
        size, b = info.num_items + 1, tables.micro_batch_size
        messages, num_bytes = info.boundary_matrix()
        starts = np.arange(size)[:, None]
        stops = starts + 1 + np.arange(width)[None, :]
        inside = stops < size
        np.minimum(stops, size - 1, out=stops)
        params = info.param_array[stops] - info.param_array[starts]  # `ChainConstants`' numbers, on the band only
        prefixes = [info.prefix_arrays(b / d1) for d1 in degrees]
        compute = np.stack([times[stops] - times[starts] for times, _ in prefixes])
        step = optimizer_step_ms_array(tables.model.device, params)
        per_iteration = [tables.model.per_iteration_array(params, d1, step) for d1 in degrees]
        acts = np.stack([acts[stops] - acts[starts] for _, acts in prefixes])
        tps, k_max, fits = tables.segment_costs(compute, messages[starts, stops], num_bytes[starts, stops], params,
                                                per_iteration, acts, inside, degrees)
        return BandGroup(first, degrees, width, tps, k_max, fits)

    def fewest(self) -> np.ndarray:
        """fewest[i, w]: the fewest degree on which segment [i, i + 1 + w) meets the target and holds its weights
        and one micro-batch, BIG where none does or past the chain's end: `SizeTables.fewest_degrees` at one
        micro-batch in flight, the groups of larger degrees first so that a smaller degree that also meets
        overwrites them."""
        fewest = np.full((self.info.num_items + 1, self.width), BIG, dtype=np.int64)
        for group in reversed(self.groups):
            meets = group.tps <= self.target
            meets &= group.fits
            meets &= group.k_max >= 1
            found = fewest_degree(meets, group.degrees, axis=0)
            np.copyto(fewest[:, :group.width], found, where=found < BIG)
        return fewest

    def offers(self) -> SegmentOffers:
        """`SizeTables.build_offers` at this target alone (low and bound both the target), from the band: every
        segment within the target is in it, with the table's numbers. An offer's `until` is exact where it is
        within the target, the only place a probe at this target reads it (a smaller degree dominates there), and
        infinite where that smaller degree's segment lies beyond its band (its TPS is then above the target).
        Read through flat indices, one `take` per array, as `build_offers` does."""
        parts: list[tuple[np.ndarray, ...]] = []
        for group in self.groups:
            for row in range(len(group.degrees)):
                tps = group.tps[row].ravel()
                flat = np.flatnonzero((tps <= self.target) & group.fits[row].ravel())
                values, own_k = tps.take(flat), group.k_max[row].ravel().take(flat)
                start, offset = np.divmod(flat, group.width)
                until = np.full(len(flat), math.inf)
                for smaller in range(group.first + row):
                    self._dominate(smaller, start, offset, own_k, until)
                keep = (values < until) & (until > dominance_cap(self.target))
                parts.append((np.full(int(keep.sum()), group.first + row), start[keep], start[keep] + 1 + offset[keep],
                              values[keep], own_k[keep], until[keep]))
        pos, start, stop, values, k_max, until = (np.concatenate([part[idx] for part in parts]) for idx in range(6))
        return self.tables.pack_offers(self.info, pos, start, stop, values, k_max, until, self.target, self.target)

    def _dominate(self, smaller: int, start: np.ndarray, offset: np.ndarray, own_k: np.ndarray,
                  until: np.ndarray) -> None:
        """Lower `until` to the TPS of the degree at position `smaller` on the same segments, where it fits, holds at
        least as many micro-batches in flight and the segment is within its band."""
        group = next(group for group in self.groups if group.first <= smaller < group.first + len(group.degrees))
        row = smaller - group.first
        within = np.flatnonzero(offset < group.width)
        cells = start.take(within) * group.width + offset.take(within)
        covers = group.fits[row].ravel().take(cells)
        covers &= group.k_max[row].ravel().take(cells) >= own_k.take(within)
        found = np.where(covers, group.tps[row].ravel().take(cells), math.inf)
        until[within] = np.minimum(until.take(within), found)


def _band_groups(degrees: tuple[int, ...], widths: list[int], size: int) -> list[tuple[tuple[int, ...], int]]:
    """The degrees evaluated together and their common width (the widest of theirs): runs of consecutive degrees,
    chosen to cost the least, each pass costing PASS_CELLS cells of numpy's fixed work plus its cells (degrees x
    starts x width). On a short chain one band of the widest for all wins; on a long one with a tight target,
    a band per degree."""
    count = len(degrees)
    best: list[tuple[float, int]] = [(0.0, 0)] + [(math.inf, 0)] * count  # per prefix of the degrees: cost, cut
    for stop in range(1, count + 1):
        for start in range(stop):
            cost = best[start][0] + PASS_CELLS + (stop - start) * size * max(widths[start:stop])
            if cost < best[stop][0]:
                best[stop] = (cost, start)
    groups, stop = [], count
    while stop:
        start = best[stop][1]
        groups.append((degrees[start:stop], max(widths[start:stop])))
        stop = start
    return groups[::-1]


def least_staging_in_band(fewest: np.ndarray) -> int:
    """The fewest devices staging the whole chain in any number of stages, each on its segment's fewest degree,
    from its band (`Band.fewest`; BIG where none): the shortest path through the stops, each stop j reached
    from the band's starts j - 1 - w at their least plus fewest[j - 1 - w, w]. One pass over the stops, where
    `merge_tails.prefix_floors` takes one over the band per stage count (up to `max_v` on a long chain)."""
    size, width = fewest.shape
    offsets = np.arange(width)[None, :]
    sources = np.arange(size)[:, None] - 1 - offsets  # per stop j, the starts of its band's segments
    inside = sources >= 0
    np.maximum(sources, 0, out=sources)
    incoming = np.where(inside, fewest[sources, offsets], BIG)
    least = np.full(size, BIG, dtype=np.int64)
    least[0] = 0
    for stop in range(1, size):
        least[stop] = min(int((least[sources[stop]] + incoming[stop]).min()), BIG)
    return int(least[-1])
