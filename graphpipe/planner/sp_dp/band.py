"""A chain's segments within a TPS target as a band: their fewest degrees and the prefix floors over them,
without the chain's whole segment table.

A segment's TPS is at least its compute per sample (the p2p and all-reduce terms add to it), and the
compute only grows with the stop, so from each start only the stops up to the last whose compute on some
degree is within the target can meet it: W stops per start, far fewer than the chain's length on a long
chain and a tight target. `fewest_in_band` evaluates the segment table's formulas
(`SizeTables.segment_costs`, shared with the table) on the band only, so every number is the table's;
`floors_in_band` is `merge_tails.prefix_floors` over those segments (the others meet nothing), the same
floors. The chain pass reads them (`Search.may_meet`, through `chain_floors`): at op level on many
devices, building the whole table of every micro-batch size was most of its time.
"""

from __future__ import annotations

import numpy as np

from graphpipe.cost.formulas.communication import ring_all_reduce_ms_array
from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.merge_tails import block_steps, held_floors
from graphpipe.planner.sp_dp.size_tables import SizeTables, fewest_degree
from graphpipe.planner.sp_dp.tables import ChainInfo
from graphpipe.planner.stage_cost import all_reduce_link

MARGIN = 1e-6  # relative, on the band's edge: a segment the rounding might let in is kept and evaluated
NARROW = 0.5  # the widest band, as a share of the chain's length, read as a band (`chain_floors`)


def band_width(tables: SizeTables, info: ChainInfo, target_ms: float) -> int:
    """Stops per start that may hold a segment within `target_ms`: the most, over starts and degrees, up to the
    last stop whose compute per sample is within it (with a margin; the chain's length for no target)."""
    b, size = tables.micro_batch_size, info.num_items + 1
    width = 1
    for d1 in tables.degrees:
        times = info.prefix_arrays(b / d1)[0]
        reach = times + target_ms * b * (1 + MARGIN) + MARGIN * abs(float(times[-1]))
        stops = np.searchsorted(times, reach, side="right")  # per start, the first stop beyond the target
        width = max(width, int((stops - 1 - np.arange(size)).max()))
    return min(width, max(1, size - 1))


def chain_floors(tables: SizeTables, info: ChainInfo, target_ms: float) -> np.ndarray:
    """`merge_tails.prefix_floors` of the chain at one micro-batch in flight: from the band where the chain has no
    parallel items and the band is at most NARROW of it, else from the whole table, its blocks stepped over on
    their least work (gathering a wide band costs more than the table, which a probe at this target builds
    anyway)."""
    if info.has_parallel:
        return held_floors(tables, info, target_ms, 1, block_steps(tables, info, target_ms))
    width = band_width(tables, info, target_ms)
    if width > NARROW * info.num_items:
        return held_floors(tables, info, target_ms, 1)
    return floors_in_band(fewest_in_band(tables, info, target_ms, width), tables.max_v)


def fewest_in_band(tables: SizeTables, info: ChainInfo, target_ms: float, width: int) -> np.ndarray:
    """fewest[i, w]: the fewest degree on which segment [i, i + 1 + w) meets `target_ms` and holds its weights
    and one micro-batch, BIG where none does or past the chain's end: `SizeTables.fewest_degrees` at one
    micro-batch in flight, on a band of `width` stops per start (`band_width`)."""
    size, b = info.num_items + 1, tables.micro_batch_size
    starts = np.arange(size)[:, None]
    stops = starts + 1 + np.arange(width)[None, :]
    inside = stops < size
    np.minimum(stops, size - 1, out=stops)
    params = info.param_array[stops] - info.param_array[starts]  # `ChainConstants`' numbers, on the band only
    prefixes = [info.prefix_arrays(b / d1) for d1 in tables.degrees]
    times = np.stack([times for times, _ in prefixes])
    acts = np.stack([acts for _, acts in prefixes])
    compute = times[:, stops] - times[:, starts]
    compute /= b
    messages, num_bytes = info.boundary_matrix()
    reduce_ms = [ring_all_reduce_ms_array(all_reduce_link(tables.model.cluster, d1), params, d1)
                 for d1 in tables.degrees]
    tps, k_max, fits = tables.segment_costs(compute, messages[starts, stops], num_bytes[starts, stops], params,
                                            reduce_ms, acts[:, stops] - acts[:, starts], inside)
    meets = tps <= target_ms
    meets &= fits
    meets &= k_max >= 1
    return fewest_degree(meets, tables.degrees, axis=0)


def floors_in_band(fewest: np.ndarray, max_v: int) -> np.ndarray:
    """`merge_tails.prefix_floors` of a chain without parallel items, from its band (`fewest_in_band`): column m
    is column m - 1 or a stage [j - 1 - w, j) after a staging of [0, j - 1 - w) in m - 1 stages."""
    size, width = fewest.shape
    offsets = np.arange(width)[None, :]
    sources = np.arange(size)[:, None] - 1 - offsets  # per stop j, the starts of its band's segments
    inside = sources >= 0
    np.maximum(sources, 0, out=sources)
    incoming = np.where(inside, fewest[sources, offsets], BIG)
    floors = np.full((size, max_v + 1), BIG, dtype=np.int64)
    floors[0] = 0
    for m in range(1, max_v + 1):
        before = floors[:, m - 1]
        column = np.minimum(before, np.minimum((before[sources] + incoming).min(axis=1), BIG))
        floors[:, m] = column
        if np.array_equal(column, before):
            floors[:, m + 1:] = column[:, None]
            break
    return floors
