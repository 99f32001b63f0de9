"""Per micro-batch size tables of the DP: segment costs of every chain, offers, merged-group options.

For one micro-batch size, every chain of the SP tree gets its segment table: compute per
sample, TPS, most micro-batches in flight and whether the weights and one micro-batch fit,
for every segment [i, j) of the chain on every data-parallel degree d1 that divides the
micro-batch (degree x (L + 1) x (L + 1) numpy arrays; `SizeTables._segment_arrays`). A probe
reads them as *offers*: the (segment, degree) pairs within its TPS target that fit and that no
smaller degree of the same segment dominates, sorted by TPS per start
(`SizeTables.build_offers`), and merged branch groups of parallel blocks as a few
(devices, TPS, most in flight) options (`SizeTables.group_options`; for the runs of a block of
many branches, all at once as arrays: `SizeTables.run_options`). The arrays that no size
changes are built once per chain (`ChainConstants`) and shared by all sizes.

Per segment [i, j) on d1 devices, with b the micro-batch and B the mini-batch, through the numpy twins of
the formulas in `graphpipe.cost.formulas` (the same numbers as `CostModel.stage_cost`):

    TPS   = (compute + p2p + actions) / b + (all_reduce(d1) + step) / B      (`time_per_sample`, the rule)
    k_max = floor((memory limit - 4 x weights) / activations of one micro-batch on one device)
            (capped at the devices + 1, the most the DP asks for; -1 where the weights alone do not fit)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphpipe.cost.formulas.communication import p2p_ms, p2p_ms_array
from graphpipe.cost.formulas.memory import (
    OPTIMIZER_STATE_FACTOR,
    UNBOUNDED,
    max_in_flight_micro_batches,
    max_in_flight_micro_batches_array,
)
from graphpipe.cost.formulas.time_per_sample import (
    optimizer_step_ms_array,
    time_per_sample_ms_array,
    time_per_sample_ms_rows,
)
from graphpipe.planner.sp_dp.blocks import BIG, merged_runs
from graphpipe.planner.sp_dp.tables import ChainInfo, ParInfo
from graphpipe.planner.stage_cost import CostModel


def fewest_degree(meets: np.ndarray, degrees: tuple[int, ...], axis: int) -> np.ndarray:
    """Along `axis` (the degrees, fewest first), the first degree where `meets` holds, BIG where none does."""
    return np.where(meets.any(axis=axis), np.array(degrees)[meets.argmax(axis=axis)], BIG)


def least_by_degree(tps: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Per degree d (the first axis, fewest first), the least TPS over the degrees up to d where `usable` (NaN where
    none is, so that no target, not even inf, is met there): the fewest degree within any target is then read by
    `fewest_within`."""
    least = np.where(usable, tps, np.nan)  # a NaN TPS meets no target either, as `tps <= target` says
    for pos in range(1, len(least)):
        np.fmin(least[pos - 1], least[pos], out=least[pos])
    return least


def fewest_within(least: np.ndarray, target_ms: float, degrees: tuple[int, ...]) -> np.ndarray:
    """The fewest degree whose TPS is within `target_ms`, BIG where none is, from `least_by_degree`: the least TPS
    never grows with the degree, so the degrees within the target are a suffix, and the count of the others is the
    position of the fewest that meets it, counted from the end (`fewest_degree` on `tps <= target`, without the mask
    over every degree)."""
    if len(least) > np.iinfo(np.uint8).max:
        within = np.count_nonzero(least <= target_ms, axis=0)
    else:  # summed a degree at a time as bytes: several times faster than counting along the first axis
        within = (least[0] <= target_ms).view(np.uint8)
        for plane in least[1:]:
            within += (plane <= target_ms).view(np.uint8)
    fewest: np.ndarray = np.array([BIG, *reversed(degrees)], dtype=np.int64)[within]
    return fewest


def divisors_up_to(value: int, limit: int) -> tuple[int, ...]:
    """Data-parallel degrees a stage with micro-batch `value` may use: divisors of it, at most `limit`."""
    return tuple(d for d in range(1, min(value, limit) + 1) if value % d == 0)


@dataclass(slots=True)
class SegmentOffers:
    """Segments of one chain with a degree each (parallel lists), each start's in
    [offsets[start], offsets[start + 1]) ordered by TPS, for targets from `low` to `bound`: all with
    TPS <= `bound`. From a target of `until` on, a smaller degree of the same segment makes every
    offer of this one at fewer devices (`SizeTables._dominated_above`); offers dominated at `low` are
    left out. What `Probe._segment_keys` derives from an offer's degree is stored instead of the degree:
    `rooms` (devices left beside it) and `keys` (its part d1 * (unit + span) + stop of the cell key).

    Cell keys. The probe picks, per cell, the offer with the fewest devices in all, then the smallest
    degree, then the shortest segment: the order of the integer

        key = (devices of the rest + d1) * unit + d1 * span + stop

    (`span` > any stop, `unit` > any d1 * span + stop), so one `<` compares all three and the winner is
    read back with two `divmod`s (`need.write_segments`)."""
    low: float
    bound: float
    tps: list[float]
    rooms: list[int]
    stops: list[int]
    k_maxes: list[int]
    until: list[float]
    keys: list[int]
    offsets: list[int]
    span: int
    unit: int


def cell_key_scale(num_items: int, num_devices: int) -> tuple[int, int]:
    """(span, unit) of a chain's cell keys (`SegmentOffers`): span > any stop, unit > any d1 * span + stop."""
    span = num_items + 2
    return span, (num_devices + 1) * span


def dominance_cap(target_ms: float) -> float:
    """An offer is dominated at `target_ms` when its `until` is at most this (an infinite `until`
    means never, even with no target at all)."""
    return min(target_ms, sys.float_info.max)


class ChainConstants:
    """The arrays of a chain's segment tables that no micro-batch size changes (`SizeTables._segment_arrays`),
    built once and shared by the tables of all sizes of one `partition_sp` call (same model and memory
    limit): each is an elementwise step of the tables' formulas, cut out as is, so the tables are the
    same numbers."""

    def __init__(self, tables: SizeTables, info: ChainInfo) -> None:
        self.params = info.param_array[None, :] - info.param_array[:, None]  # weights of [i, j)
        self.later = np.triu(np.ones(self.params.shape, dtype=bool), 1)  # j > i
        self._model = tables.model
        self._step: np.ndarray | None = None
        self._per_iteration: dict[int, np.ndarray] = {}

    def per_iteration(self, d1: int) -> np.ndarray:
        """The rule's once-per-iteration term per sample of each segment on d1 devices: its weights' all-reduce and
        optimizer step over B (`CostModel.per_iteration_array`; the step, the same on every degree, made once)."""
        hit = self._per_iteration.get(d1)
        if hit is None:
            if self._step is None:
                self._step = optimizer_step_ms_array(self._model.device, self.params)
            hit = self._per_iteration[d1] = self._model.per_iteration_array(self.params, d1, self._step)
        return hit


class SizeTables:
    """The segment tables, offers and merged-group options of one micro-batch size (cached per chain)."""

    def __init__(self, model: CostModel, num_devices: int, micro_batch_size: int, memory_limit: float,
                 constants: dict[int, ChainConstants] | None = None) -> None:
        """`constants`: per chain index, shared by the tables of every size with the same model and limit."""
        self.model = model
        self.num_devices = num_devices
        self.micro_batch_size = micro_batch_size
        self.memory_limit = memory_limit
        self.global_batch_size = model.global_batch_size
        self.num_micro_batches = model.global_batch_size // micro_batch_size  # no stage holds more
        self.degrees = divisors_up_to(micro_batch_size, num_devices)
        self.max_v = num_devices + 1
        self.constants = {} if constants is None else constants  # shared by the sizes of one model and memory limit
        self._segments: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._rows: dict[tuple[int, int, int], tuple[list[float], list[float], list[int]]] = {}
        self._groups: dict[tuple[int, int], list[tuple[int, float, int]]] = {}
        self._totals: dict[tuple[int, int], list[tuple[float, float]]] = {}
        self._joined: dict[tuple[int, int, tuple[str, ...]], list[tuple[int, float, int]]] = {}
        self._runs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._by_count: dict[int, list[list[tuple[int, float, int]]] | None] = {}
        self._least: dict[tuple[int, int], np.ndarray] = {}  # see `_fewest_holding`
        self._count_free: dict[int, bool] = {}  # see `fewest_free`
        self._extends: dict[tuple[int, int], bool] = {}  # see `extends`

    def segment_rows(self, info: ChainInfo, start: int, d1: int,
                     target_ms: float) -> tuple[list[float], list[float], list[int]]:
        """(compute per sample, TPS, most micro-batches in flight) of segments [start, start + 1 + idx) on d1
        devices, by growing idx, while the weights and one micro-batch fit (so at least as far as the compute
        stays within `target_ms`). Compute never decreases along a row, so the segments within a target are
        the prefix `bisect_right(compute, target)`. Cut from `_table`'s arrays into plain lists once."""
        key = (info.content, d1, start)
        row = self._rows.get(key)
        if row is None:
            compute, tps, k_max, fits = self._table(info)
            pos = self.degrees.index(d1)
            stop = start + 1 + int(np.count_nonzero(fits[pos, start]))
            cut = (pos, start, slice(start + 1, stop))
            row = self._rows[key] = (compute[cut].tolist(), tps[cut].tolist(), k_max[cut].tolist())
        return row

    def build_offers(self, info: ChainInfo, low: float, bound: float) -> SegmentOffers:
        """Offers within `bound` (TPS >= compute, so the compute is within too) and not dominated at `low`, read
        through flat indices (one `take` per array, no 3-D fancy indexing), packed by `pack_offers`."""
        _, tps, k_max, fits = self._table(info)
        mask = tps <= bound
        mask &= fits
        flat = np.flatnonzero(mask)
        values = tps.ravel()[flat]
        until = self._dominated_above(flat, tps, k_max, fits)
        keep = values < until
        keep &= until > dominance_cap(low)
        flat, values, until = flat[keep], values[keep], until[keep]
        side = info.num_items + 1
        pos, rest = np.divmod(flat, side * side)
        start, stop = np.divmod(rest, side)
        return self.pack_offers(info, pos, start, stop, values, k_max.ravel()[flat], until, low, bound)

    def pack_offers(self, info: ChainInfo, pos: np.ndarray, start: np.ndarray, stop: np.ndarray, values: np.ndarray,
                    k_max: np.ndarray, until: np.ndarray, low: float, bound: float) -> SegmentOffers:
        """`SegmentOffers` of the offers given as parallel arrays (degree position, start, stop, TPS, most in flight,
        `until`), in any order: ordered by TPS and then, stably, by start (a radix sort). The order among a start's
        offers of equal TPS is free, as `Probe._segment_keys` keeps the same cell whatever the order."""
        side = info.num_items + 1
        order = np.argsort(values)
        order = order[np.argsort(start[order].astype(np.min_scalar_type(side)), kind="stable")]
        pos, start, stop, values, k_max, until = (part[order] for part in (pos, start, stop, values, k_max, until))
        degrees = np.array(self.degrees)[pos]
        span, unit = cell_key_scale(info.num_items, self.num_devices)
        offsets = np.searchsorted(start, np.arange(info.num_items + 2))
        return SegmentOffers(low=low, bound=bound, tps=values.tolist(), rooms=(self.num_devices - degrees).tolist(),
                             stops=stop.tolist(), k_maxes=k_max.tolist(), until=until.tolist(),
                             keys=(degrees * (unit + span) + stop).tolist(), offsets=offsets.tolist(), span=span,
                             unit=unit)

    @staticmethod
    def _dominated_above(flat: np.ndarray, tps: np.ndarray, k_max: np.ndarray, fits: np.ndarray) -> np.ndarray:
        """Per offer (flat index into the degree x segment arrays), the smallest TPS of a smaller degree of the
        same segment that holds at least as many micro-batches in flight (inf if none): from that target on,
        the smaller degree makes every offer of this one at fewer devices, so this one can never win a cell.
        Read only at the offers within the bound, the few cells a tight target leaves of the whole table."""
        plane = tps[0].size
        pos, cell = np.divmod(flat, plane)
        own_k = k_max.ravel()[flat]
        until = np.full(len(flat), math.inf)
        shape = (len(tps), plane)
        tps2, k_max2, fits2 = tps.reshape(shape), k_max.reshape(shape), fits.reshape(shape)
        for smaller in range(len(tps) - 1):
            first = int(np.searchsorted(pos, smaller, side="right"))  # flat indices ascend, so degrees do
            cells, mine = cell[first:], until[first:]
            covers = fits2[smaller].take(cells)
            covers &= k_max2[smaller].take(cells) >= own_k[first:]
            np.minimum(mine, np.where(covers, tps2[smaller].take(cells), math.inf), out=mine)
        return until

    def _table(self, info: ChainInfo) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        table = self._segments.get(info.content)
        if table is None:
            table = self._segments[info.content] = self._segment_arrays(info)
        return table

    def _segment_arrays(self, info: ChainInfo) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(compute per sample, TPS, most in flight, fits) of segments [i, j) as degree x (L + 1) x (L + 1) arrays.

        `fits[d, i, j]`: j > i and every [i, j') with i < j' <= j holds its weights and one micro-batch.
        Computed in place where it can: the arrays of a long chain are large."""
        b = self.micro_batch_size
        fixed = self.constants.get(info.content)
        if fixed is None:
            fixed = self.constants[info.content] = ChainConstants(self, info)
        prefixes = [info.prefix_arrays(b / d1) for d1 in self.degrees]
        times = np.stack([times for times, _ in prefixes])[:, None, :]
        acts = np.stack([acts for _, acts in prefixes])[:, None, :]
        compute = times - times.transpose(0, 2, 1)
        messages, num_bytes = info.boundary_matrix()
        tps, k_max, fits = self.segment_costs(compute, messages, num_bytes, fixed.params,
                                              [fixed.per_iteration(d1) for d1 in self.degrees],
                                              acts - acts.transpose(0, 2, 1), fixed.later)
        compute /= b
        return compute, tps, k_max, fits

    def segment_costs(self, compute: np.ndarray, messages: np.ndarray, num_bytes: np.ndarray, params: np.ndarray,
                      per_iteration: Sequence[np.ndarray], acts: np.ndarray,
                      later: np.ndarray, degrees: Sequence[int] | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(TPS, most in flight, fits) of segments, degree x start x stop, from their compute per micro-batch,
        boundary messages and bytes per sample, weights, once-per-iteration term per degree
        (`ChainConstants.per_iteration`) and activations (`acts`, overwritten), with `later` marking the segments
        that exist (stops along the last axis, from the first on): the table's formulas, elementwise, for the whole
        table and for a band of it (`band`), on `degrees` (all by default)."""
        b = self.micro_batch_size
        per_device = np.array([b / d1 for d1 in (self.degrees if degrees is None else degrees)])[:, None, None]
        comm = p2p_ms_array(self.model.link, messages, num_bytes * per_device)
        tps = time_per_sample_ms_rows(self.model.device, compute, comm, per_iteration, b)
        k_max = max_in_flight_micro_batches_array(params, acts, self.memory_limit, self.num_micro_batches, self.max_v)
        fits = np.logical_or.accumulate((k_max < 1) & later, axis=2)  # every shorter segment of the start fits too
        np.logical_not(fits, out=fits)
        fits &= later
        return tps, k_max, fits

    def group_options(self, pinfo: ParInfo, group: int) -> list[tuple[int, float, int]]:
        """(devices, TPS, most micro-batches in flight) of merged branches, fewest devices first; cached."""
        key = (pinfo.index, group)
        hit = self._groups.get(key)
        if hit is None:
            params, messages, num_bytes = pinfo.group_costs(group)
            hit = self._groups[key] = self._options(params, messages, num_bytes, self._group_totals(pinfo, group))
        return hit

    def options_by_count(self, pinfo: ParInfo) -> list[list[tuple[int, float, int]]] | None:
        """For a block of twin branches (all of one content) whose merged groups of equal size have equal options:
        those options per group size (index 0 unused), so the grouping DP may run over counts (`Probe._solve_twins`);
        None otherwise. Decided once per block and size; a block of runs (`ParInfo.interval`) is never asked."""
        if pinfo.index not in self._by_count:
            self._by_count[pinfo.index] = self._equal_by_count(pinfo)
        return self._by_count[pinfo.index]

    def _equal_by_count(self, pinfo: ParInfo) -> list[list[tuple[int, float, int]]] | None:
        count = len(pinfo.branch_infos)
        if len({info.content for info in pinfo.branch_infos}) > 1:
            return None
        by_count: list[list[tuple[int, float, int]] | None] = [None] * (count + 1)
        for group in range(1, 1 << count):
            size = group.bit_count()
            if size < 2:
                continue
            options = self.group_options(pinfo, group)
            if by_count[size] is None:
                by_count[size] = options
            elif by_count[size] != options:
                return None  # a shared producer, say, makes some unions cheaper than others
        return [options or [] for options in by_count]

    def run_options(self, pinfo: ParInfo) -> tuple[np.ndarray, np.ndarray]:
        """(TPS, most in flight) of every run [g, s) of at least two sorted branches merged into one stage, as
        (n + 1) x (n + 1) x degrees arrays (inf and -1 elsewhere, and where the weights alone do not fit), for
        the DP over runs (`runs.fewest_per_run`); cached. The numbers of `group_options`, float for float: its
        formulas evaluated elementwise in the same order, on its totals (each run's left fold over its branches
        is `np.add.accumulate` from the run's first branch)."""
        hit = self._runs.get(pinfo.index)
        if hit is None:
            hit = self._runs[pinfo.index] = self._run_arrays(pinfo)
        return hit

    def _run_arrays(self, pinfo: ParInfo) -> tuple[np.ndarray, np.ndarray]:
        count, width = len(pinfo.branch_infos), len(self.degrees)
        size, b, model = count + 1, self.micro_batch_size, self.model
        single = np.array([self._group_totals(pinfo, 1 << pos) for pos in range(count)])  # branch x degree x 2
        totals = np.zeros((size, size, width, 2))
        for start in range(count):
            totals[start, start + 1:] = np.add.accumulate(single[start:], axis=0)
        params, messages, num_bytes = pinfo.run_traffic()
        fits = OPTIMIZER_STATE_FACTOR * params <= self.memory_limit
        fits &= merged_runs(size)
        spare = self.memory_limit - OPTIMIZER_STATE_FACTOR * params
        tps, k_max = np.full((size, size, width), math.inf), np.full((size, size, width), -1, dtype=np.int64)
        weights = params.astype(float)
        step = optimizer_step_ms_array(model.device, weights)
        for pos, d1 in enumerate(self.degrees):
            compute, act = totals[:, :, pos, 0], totals[:, :, pos, 1]
            comm = p2p_ms_array(model.link, messages, num_bytes * b / d1)
            per_iteration = model.per_iteration_array(weights, d1, step)
            plane = time_per_sample_ms_array(model.device, compute, comm, per_iteration, b)
            tps[:, :, pos] = np.where(fits, plane, math.inf)
            with np.errstate(divide="ignore", invalid="ignore"):
                most = np.floor_divide(spare, act)
            most = np.where(act > 0, np.where(most >= self.num_micro_batches, UNBOUNDED, most), UNBOUNDED)
            k_max[:, :, pos] = np.where(fits, np.where(spare < 0, -1, most), -1)
        return tps, k_max

    def joined_options(self, pinfo: ParInfo, start: int, join_ops: tuple[str, ...]) -> list[tuple[int, float, int]]:
        """`group_options` of the sorted branches from `start` on merged with the join run (`ParInfo.with_join`)."""
        key = (pinfo.index, start, join_ops)
        hit = self._joined.get(key)
        if hit is None:
            _, params, messages, num_bytes = pinfo.with_join(start, join_ops)
            branches = self._group_totals(pinfo, pinfo.lightest_from(start))
            joins = (self.model.group_at(join_ops, self.micro_batch_size / d1) for d1 in self.degrees)
            totals = [(compute + join_compute, act + join_act)
                      for (compute, act), (join_compute, join_act) in zip(branches, joins)]
            hit = self._joined[key] = self._options(params, messages, num_bytes, totals)
        return hit

    def _options(self, params: float, messages: int, num_bytes: float,
                 totals: Sequence[tuple[float, float]]) -> list[tuple[int, float, int]]:
        """(devices, TPS, most in flight) per degree of one stage from its weights, traffic and per-degree
        (compute, activations); none when its weights and optimizer state alone exceed the limit."""
        if OPTIMIZER_STATE_FACTOR * params > self.memory_limit:
            return []
        b, model = self.micro_batch_size, self.model
        return [(d1, model.tps_ms(compute, p2p_ms(model.link, messages, num_bytes * b / d1), params, d1, b),
                 max_in_flight_micro_batches(params, act, self.memory_limit, self.num_micro_batches))
                for d1, (compute, act) in zip(self.degrees, totals)]

    def _group_totals(self, pinfo: ParInfo, mask: int) -> list[tuple[float, float]]:
        """Per degree, (compute, activations) of the branches in `mask`: their prefix-sum totals added in branch
        order, the lower branches' sum first (so a group reuses the one without its top branch)."""
        key = (pinfo.index, mask)
        hit = self._totals.get(key)
        if hit is None:
            top = 1 << (mask.bit_length() - 1)
            if mask == top:
                info, b = pinfo.branch_infos[mask.bit_length() - 1], self.micro_batch_size
                totals = (info.prefix_at(b / d1) for d1 in self.degrees)
                hit = [(0.0 + times[-1], 0.0 + acts[-1]) for times, acts in totals]
            else:
                lower, mine = self._group_totals(pinfo, mask ^ top), self._group_totals(pinfo, top)
                hit = [(c + c_top, a + a_top) for (c, a), (c_top, a_top) in zip(lower, mine)]
            self._totals[key] = hit
        return hit

    def fewest_degrees(self, info: ChainInfo, target_ms: float, held: np.ndarray) -> np.ndarray:
        """Per count w of `held` and segment [i, j), the fewest degree on which the segment meets the target and
        holds its weights and w micro-batches in flight (BIG where none does): what a stage of it costs where it
        holds w (`merge_tails.prefix_needs`), or at least w (`merge_tails.prefix_floors`)."""
        if len(held) == 1:
            return self._fewest_holding(info, int(held[0]), target_ms)[None]
        _, tps, k_max, fits = self._table(info)
        meets = tps <= target_ms
        meets &= fits
        holds = meets[None] & (k_max[None] >= held[:, None, None, None])
        return fewest_degree(holds, self.degrees, axis=1)

    def loose_last(self, info: ChainInfo, stop: int, target_ms: float, held: int) -> np.ndarray:
        """Per start i < `stop`, the fewest degree on which segment [i, stop) is within the target counting only the
        tensors it receives, not those it sends, and holds its weights and `held` micro-batches, BIG where none does:
        the last stage of a cut prefix (`Probe.cut_floor`). The rule's twin on the table's own terms (the compute
        as `_segment_arrays` subtracts it), the p2p time from the receiving side of the boundary
        (`ChainInfo.incoming`), so at most the TPS to the last bit."""
        _, _, k_max, fits = self._table(info)
        fixed = self.constants[info.content]  # built with the table
        messages, num_bytes = info.incoming(stop)
        b, device = self.micro_batch_size, self.model.device
        per_sample = np.empty((len(self.degrees), stop))
        for row, d1 in zip(per_sample, self.degrees):
            times = info.prefix_arrays(b / d1)[0]
            comm = p2p_ms_array(self.model.link, messages, num_bytes * (b / d1))
            row[:] = time_per_sample_ms_array(device, times[stop] - times[:stop], comm,
                                              fixed.per_iteration(d1)[:stop, stop], b)
        meets = per_sample <= target_ms
        meets &= fits[:, :stop, stop]
        meets &= k_max[:, :stop, stop] >= held
        return fewest_degree(meets, self.degrees, axis=0)

    def fewest_free(self, info: ChainInfo, target_ms: float) -> np.ndarray | None:
        """The fewest degree of every segment at one micro-batch in flight (`fewest_degrees`), where it is also the
        fewest at every count the DP asks for (`max_v`), else None: then no stage's degree depends on its
        in-flight count at this target, and the chain's need vectors are its prefix floors
        (`merge_tails.prefix_floors`, `Probe.entry_need`, `merge_tails.PrefixNeeds`). Fewest degrees only grow
        with the count, so equal at both ends they are equal at every count between. Where every segment that holds
        one micro-batch holds `max_v` (memory does not bind), that is so at every target, and the test is skipped."""
        one = self._fewest_holding(info, 1, target_ms)
        if self._holds_every_count(info):
            return one
        return one if np.array_equal(one, self._fewest_holding(info, self.max_v, target_ms)) else None

    def extends(self, info: ChainInfo) -> bool:
        """Whether `info` is its `prefix_of` chain with one item appended, its segments within that chain costing the
        same to the last bit on every degree (TPS, most in flight, fits), so that the two share their floors over
        them (`ForkJoinSolver.free_floors`). Checked once per pair of chains and size."""
        base = info.prefix_of
        if base is None:
            return False
        key = (info.content, base.content)
        same = self._extends.get(key)
        if same is None:
            size = base.num_items + 1
            mine, theirs = self._table(info)[1:], self._table(base)[1:]
            same = self._extends[key] = all(
                np.array_equal(part[:, :size, :size], other) for part, other in zip(mine, theirs))
        return same

    def fewest_free_last(self, info: ChainInfo, target_ms: float) -> np.ndarray | None:
        """`fewest_free` of the segments that end at the chain's last stop only, per start: the column that
        `extends` leaves to compute (None where a count changes one of them)."""
        one = fewest_within(self._least_holding(info, 1)[:, :, -1], target_ms, self.degrees)
        if self._holds_every_count(info):
            return one
        most = fewest_within(self._least_holding(info, self.max_v)[:, :, -1], target_ms, self.degrees)
        return one if np.array_equal(one, most) else None

    def _holds_every_count(self, info: ChainInfo) -> bool:
        """Every segment on every degree that fits and holds one micro-batch holds `max_v` (cached per chain): then
        its fewest degrees are the same at every count and target."""
        free = self._count_free.get(info.content)
        if free is None:
            _, _, k_max, fits = self._table(info)
            usable = fits & (k_max >= 1)
            free = self._count_free[info.content] = bool(np.array_equal(usable, usable & (k_max >= self.max_v)))
        return free

    def _fewest_holding(self, info: ChainInfo, held: int, target_ms: float) -> np.ndarray:
        """`fewest_degrees` at one count, for any target, from one table per (chain, count) built once: per degree
        d, the least TPS over the degrees up to d that fit and hold `held` (`least_by_degree`, read by
        `fewest_within`). The floors read a count per probe, each at its own target."""
        return fewest_within(self._least_holding(info, held), target_ms, self.degrees)

    def _least_holding(self, info: ChainInfo, held: int) -> np.ndarray:
        """`least_by_degree` of the chain's segments that fit and hold `held`, built once per chain and count."""
        key = (info.content, held)
        least = self._least.get(key)
        if least is None:
            _, tps, k_max, fits = self._table(info)
            usable = k_max >= held
            usable &= fits
            least = self._least[key] = least_by_degree(tps, usable)
        return least
