"""A merge stage's traffic on every pair of tails at once (`merge_boundary`).

A merge stage M (`fork_join`) takes a block's join run J and the tails [s_0, n_0) and [s_1, n_1) of
both branches, numbered t = n - 1 - s (shortest first). A tensor is received by M when its producer
is outside and a consumer inside, sent when the reverse. Whether an op is inside depends on one cut
only: an op of branch b at item i is inside from tail n_b - 1 - i on (its `first`), J always, anything
else never. So per producer, with `least_b` and `most_b` the least and the greatest first of its
consumers in branch b:

    no consumer inside  = (no consumer in J) and t_b < least_b for each b        (a rectangle)
    no consumer outside = (no consumer elsewhere) and t_b >= most_b for each b    (a rectangle)
    crossing            = 1 - [inside and no consumer outside] - [outside and no consumer inside]

where "inside" is a half-plane of its own branch's cut (or everything, or nothing), so each producer
adds one rectangle and takes away at most two, and the sums over producers are 2-D prefix sums of the
rectangles' corners (`tables.rectangle_sums`): O(producers + pairs). Where a byte sum could round
(`tables.exact_sums`), the producers' conditions are broadcast and added one by one instead, in a fixed
order (`merge_boundary_by_producer`, the reference the rectangles equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphpipe.planner.sp_dp.tables import ParInfo, exact_sums, rectangle_sums

Cut = np.ndarray | bool  # a condition on the cuts: a column (n_0 x 1, branch 0's), a row (1 x n_1) or a constant
Span = tuple[int, int, int, int]  # tails t_0 in [r0, r1) and t_1 in [c0, c1)


def merge_boundary(pinfo: ParInfo, join_ops: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(messages, bytes per sample) across M's boundary for every pair of tails (t_0, t_1), as n_0 x n_1
    matrices: `CostModel.boundary` of `ParInfo.merge_ops` on every pair. Cached on `pinfo`: every micro-batch
    size reads the same."""
    hit = pinfo.merge_boundaries.get(join_ops)
    if hit is None:
        hit = pinfo.merge_boundaries[join_ops] = _merge_boundary(pinfo, join_ops)
    return hit


def _merge_boundary(pinfo: ParInfo, join_ops: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The rectangles' sums where they are exact, else the sums producer by producer."""
    wiring = _Wiring.of(pinfo, join_ops)
    size = pinfo.model.out_bytes_per_sample
    sizes = [size[producer] for producer in wiring.producers]
    if not exact_sums(sizes, times=12):  # 3 rectangles each
        return _by_producer(wiring)
    return rectangle_sums(_rectangles(wiring, np.array(sizes, dtype=float)), wiring.shape)


@dataclass(frozen=True, slots=True)
class _Wiring:
    """What the traffic of M reads of a block: per branch op its branch and `first` tail, J's ops, every op that
    sends to or within the branches and J (in a fixed order), and the pairs' shape (n_0, n_1)."""

    pinfo: ParInfo
    first: dict[str, tuple[int, int]]
    joins: frozenset[str]
    producers: tuple[str, ...]
    shape: tuple[int, int]

    @classmethod
    def of(cls, pinfo: ParInfo, join_ops: tuple[str, ...]) -> _Wiring:
        first: dict[str, tuple[int, int]] = {}  # op -> (branch, tail t from which it is inside)
        for pos, info in enumerate(pinfo.branch_infos):
            for item, ops in enumerate(info.item_ops):
                for op in ops:
                    first[op] = (pos, info.num_items - 1 - item)
        producers = dict.fromkeys([*first, *join_ops])
        for op in list(producers):
            producers.update(dict.fromkeys(pinfo.model.preds[op]))
        shape = (pinfo.branch_infos[0].num_items, pinfo.branch_infos[1].num_items)
        return cls(pinfo, first, frozenset(join_ops), tuple(producers), shape)

    def readers(self, producer: str) -> tuple[list[int], list[int], bool, bool]:
        """Per branch the least and the greatest `first` of the producer's consumers there (-1: none), whether
        one is in J, whether one is elsewhere."""
        least, most = [-1, -1], [-1, -1]
        in_join = elsewhere = False
        for consumer in self.pinfo.model.succs[producer]:
            if consumer in self.joins:
                in_join = True
            elif consumer in self.first:
                pos, at = self.first[consumer]
                least[pos] = at if least[pos] < 0 else min(least[pos], at)
                most[pos] = max(most[pos], at)
            else:
                elsewhere = True
        return least, most, in_join, elsewhere


def _rectangles(wiring: _Wiring, sizes: np.ndarray) -> np.ndarray:
    """Every producer's crossing indicator as rectangles (rows r0 to r1 and columns c0 to c1, inclusive, a count
    and the bytes per sample; module docstring): the whole plane, less its inside where no consumer is outside and
    its outside where none is inside, where those are not empty. Per axis b, the inside is [at, n_b) for an op of
    branch b, else everything (J) or nothing (an op outside); the outside is the rest."""
    least, most, in_join, elsewhere, kind, at = (np.array(column) for column in
                                                 zip(*(_reading(wiring, producer) for producer in wiring.producers)))
    ends = np.array(wiring.shape)
    own = np.stack([kind == _BRANCH_0, kind == _BRANCH_1], axis=1)  # the axis of the producer's own cut
    inside_from = np.where(own, at[:, None], 0)
    outside_to = np.where(own, at[:, None], ends)
    nobody_out_from = np.maximum(most, 0)  # no consumer outside: t_b >= the greatest first in branch b
    nobody_in_to = np.where(least >= 0, least, ends)  # no consumer inside: t_b < the least first in branch b
    zeros, full = np.zeros_like(inside_from), np.broadcast_to(ends, inside_from.shape)
    parts = [(zeros, full, 1.0, np.ones(len(kind), dtype=bool)),
             (np.maximum(inside_from, nobody_out_from), full, -1.0, (kind != _OUTSIDE) & ~elsewhere),
             (zeros, np.minimum(outside_to, nobody_in_to), -1.0, (kind != _JOIN) & ~in_join)]
    rects = []
    for low, high, count, valid in parts:
        keep = valid & (low < high).all(axis=1)
        rects.append(np.column_stack([low[:, 0], high[:, 0] - 1, low[:, 1], high[:, 1] - 1,
                                      np.full(len(kind), count), sizes])[keep])
    return np.concatenate(rects)


_JOIN, _OUTSIDE, _BRANCH_0, _BRANCH_1 = range(4)


def _reading(wiring: _Wiring, producer: str) -> tuple[list[int], list[int], bool, bool, int, int]:
    """`_Wiring.readers`, the producer's kind and, for a branch op, its `first` tail."""
    least, most, in_join, elsewhere = wiring.readers(producer)
    if producer in wiring.joins:
        return least, most, in_join, elsewhere, _JOIN, 0
    found = wiring.first.get(producer)
    if found is None:
        return least, most, in_join, elsewhere, _OUTSIDE, 0
    return least, most, in_join, elsewhere, _BRANCH_0 + found[0], found[1]


def merge_boundary_by_producer(pinfo: ParInfo, join_ops: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`merge_boundary` producer by producer: each condition is a column (branch 0's cut), a row (branch 1's) or a
    constant, summed apart and broadcast once at the end."""
    return _by_producer(_Wiring.of(pinfo, join_ops))


def _by_producer(wiring: _Wiring) -> tuple[np.ndarray, np.ndarray]:
    shape = wiring.shape
    cuts = (np.arange(shape[0])[:, None], np.arange(shape[1])[None, :])
    totals = {kind: (np.zeros(size), np.zeros(size)) for kind, size in
              (("col", (shape[0], 1)), ("row", (1, shape[1])), ("both", shape), ("const", ()))}
    for producer in wiring.producers:
        crossing = _crossing(wiring, producer, cuts)
        if crossing is False:
            continue
        kind = "const" if crossing is True else "both" if crossing.shape == shape else \
            "col" if crossing.shape[1] == 1 else "row"
        messages, num_bytes = totals[kind]
        messages += crossing
        num_bytes += np.multiply(crossing, wiring.pinfo.model.out_bytes_per_sample[producer])
    messages, num_bytes = (sum(parts[idx] for parts in totals.values()) + np.zeros(shape) for idx in (0, 1))
    return messages, num_bytes


def _crossing(wiring: _Wiring, producer: str, cuts: Sequence[np.ndarray]) -> Cut:
    """Where `producer`'s tensor crosses M's boundary (module docstring), as a condition on the cuts."""
    least, most, in_join, elsewhere = wiring.readers(producer)
    some_in: Cut = in_join
    some_out: Cut = elsewhere
    for pos in (0, 1):
        if least[pos] >= 0:
            some_in = some_in | (cuts[pos] >= least[pos])
            some_out = some_out | (cuts[pos] < most[pos])
    if producer in wiring.joins:
        return some_out
    if producer not in wiring.first:
        return some_in
    pos, at = wiring.first[producer]
    mine = cuts[pos] >= at
    return (mine & some_out) | (~mine & some_in)
