"""A chain row where items start (a parallel item, fork/join blocks): written candidate by candidate, then settled.

Such a row (`Probe._solve_chain`) takes its segments first (`need.write_segments`), then, per item starting there
and per in-flight count k_after at which the rest of the chain drops (a breakpoint, `devices` its need there), the
item's need vector given k_after plus those devices, at every cell v > k_after where that is strictly cheaper than
what the row holds (the choice `(kind, with_join, k_after, v)`), and is then settled like any row (`need.settle`).
Strict improvements in a fixed order make each cell's choice the first candidate that reaches its least value.
A row also says when a candidate could change nothing (`overridden`: no better than what each cell holds, or above
what a smaller v holds), which lets `Probe._before` skip solving it.

Two forms of the same step, chosen by the number of cells (`row_for`):

- `ListRow`, a Python step per cell: the cheaper form up to about 130 cells (devices + 2), where a numpy call
  costs as much as the cells it replaces or more;
- `ArrayRow`, a numpy step per candidate, from ARRAY_CELLS on: at 512 devices a row has 514 cells, and on
  CLIP's towers at op level 25 candidates on average, and the per-cell loop was over half of a probe's
  profile. Its choices are decoded on demand (`RowChoices`): only the cells a plan is rebuilt from are read.

Replayed on the rows one probe builds (docs/architecture.md, "A row where blocks start is built as arrays"):
at 66 cells lists take about half the time of arrays, at 130 the same, at 514 a sixth.

`tests/planner/test_rows.py` proves both forms give the same row, choices and breakpoints.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import pairwise
from typing import Final

import numpy as np

from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.need import (
    SEG,
    BlockSol,
    ChainChoice,
    ItemKind,
    LayoutChoice,
    drops,
    feasible_breakpoints_of_rows,
    settle,
    write_segments,
)

ARRAY_CELLS: Final = 192  # cells (devices + 2) from which a row is built as arrays

Segments = tuple[list[int], list[int]] | None  # (best key per u, the u written), `Probe._segment_keys`; None: none
Vector = list[int] | np.ndarray


class ListRow:
    """The row as lists, written cell by cell (`need.write_segments`, then each candidate, then `need.settle`)."""

    __slots__ = ("chosen", "holds_items", "row")

    def __init__(self, cells: int, segments: Segments, span: int, unit: int) -> None:
        self.row: list[int] = [BIG] * cells
        self.chosen: list[ChainChoice | None] = [None] * cells
        self.holds_items = False  # an item was written: else the row is its segments' (`need.settle_segments`)
        if segments is not None:
            write_segments(*segments, span, unit, self.row, self.chosen)

    def write(self, kind: ItemKind, with_join: bool, k_after: int, devices: int, vector: Vector) -> None:
        """The item given k_after, then the rest at k_after on `devices`: each cell is read once, so the loop reads
        the row as it was before this candidate."""
        row, chosen, first = self.row, self.chosen, k_after + 1
        self.holds_items = True
        for v, here, now in zip(range(first, len(row)), vector[first:], row[first:]):
            cost = here + devices
            if cost < now:
                row[v] = cost
                chosen[v] = (kind, with_join, k_after, v)

    def overridden(self, k_after: int, devices: int, floor: Vector, changes: list[int] | None = None) -> bool:
        """True when no vector at or above `floor`, written at k_after on `devices`, would change the settled row or
        its choices: at every cell it is no better than what the cell holds, or above what a smaller v already
        holds (which `settle` keeps instead, then as later candidates only lower cells).

        Read per run of cells where the floor is constant (`changes`: where it changes value, `need.drops`, found
        here when not given; one or two runs above k_after on CLIP's towers): in a run, a cell can be bettered only
        while the cells below it hold no less than the run's cost, a prefix of the run that usually ends at its
        first cell."""
        row, first = self.row, k_after + 1
        if first >= len(row):
            return True
        if changes is None:
            changes = drops(list(floor))
        bounds = [first, *changes[bisect_right(changes, first):], len(row)]
        for start, stop in pairwise(bounds):
            cost = floor[start] + devices
            if min(row[:start]) < cost:
                continue
            for now in row[start:stop]:
                if cost < now:
                    return False
                if now < cost:
                    break
        return True

    def settle(self, num_devices: int) -> tuple[list[int], list[ChainChoice | None], list[tuple[int, int]]]:
        found = settle(self.row, self.chosen, num_devices)
        return self.row, self.chosen, found


class ArrayRow:
    """The row as arrays: its values, and per cell who wrote it last (-1 nobody, 0 a segment, i > 0 the i-th item
    candidate written)."""

    __slots__ = ("items", "keys", "span", "unit", "values", "writer")

    def __init__(self, cells: int, segments: Segments, span: int, unit: int) -> None:
        self.values = np.full(cells, BIG, dtype=np.int64)
        self.writer = np.full(cells, -1, dtype=np.int64)
        self.items: list[tuple[ItemKind, bool, int]] = []
        self.keys: dict[int, int] = {}  # per u written, its segment's cell key (the full list is not kept)
        self.span, self.unit = span, unit
        if segments is not None:
            best, written = segments
            self.keys = {u: best[u] for u in written}
            cells_written = np.array(written, dtype=np.int64) + 1
            self.values[cells_written] = np.array(list(self.keys.values()), dtype=np.int64) // unit
            self.writer[cells_written] = 0

    def write(self, kind: ItemKind, with_join: bool, k_after: int, devices: int, vector: Vector) -> None:
        """`ListRow.write` on the row's cells above k_after at once."""
        first = k_after + 1
        cost = np.asarray(vector[first:], dtype=np.int64) + devices
        held = self.values[first:]
        better = cost < held
        if better.any():
            self.items.append((kind, with_join, k_after))
            held[better] = cost[better]
            self.writer[first:][better] = len(self.items)

    @property
    def holds_items(self) -> bool:
        """Whether an item bettered a cell: else the row is its segments' (`need.settle_segments`)."""
        return bool(self.items)

    def overridden(self, k_after: int, devices: int, floor: Vector, changes: list[int] | None = None) -> bool:
        """`ListRow.overridden` on the row's cells above k_after at once (`changes` is not needed)."""
        first = k_after + 1
        cost = np.asarray(floor[first:], dtype=np.int64) + devices
        below = np.minimum.accumulate(self.values)[first - 1:-1]  # per cell v, the least of the cells under it
        return not bool(np.any((cost < self.values[first:]) & (cost <= below)))

    def settle(self, num_devices: int) -> tuple[list[int], RowChoices, list[tuple[int, int]]]:
        """`need.settle` on arrays (`monotone`), then the cap and the feasible breakpoints (`need`'s reader of a
        table's breakpoints, on this one row)."""
        least, source = monotone(self.values)
        row: list[int] = np.where(least <= num_devices, least, BIG).tolist()
        found = feasible_breakpoints_of_rows(least[None], num_devices)[0]
        return row, RowChoices(self.writer[source], source, self), found


class RowChoices:
    """An `ArrayRow`'s settled choices, each decoded when read (`Probe.emit_chain`): the same tuples as `ListRow`'s."""

    __slots__ = ("items", "keys", "source", "span", "unit", "writer")

    def __init__(self, writer: np.ndarray, source: np.ndarray, row: ArrayRow) -> None:
        self.writer, self.source = writer, source
        self.items, self.keys, self.span, self.unit = row.items, row.keys, row.span, row.unit

    def __getitem__(self, v: int) -> ChainChoice | None:
        writer, cell = int(self.writer[v]), int(self.source[v])
        if writer < 0:
            return None
        if writer == 0:  # the segment written at cell u + 1 (`need.write_segments`)
            d1, stop = divmod(self.keys[cell - 1] % self.unit, self.span)
            return (SEG, stop, d1, cell - 1)
        kind, with_join, k_after = self.items[writer - 1]
        return (kind, with_join, k_after, cell)

    def __len__(self) -> int:
        return len(self.writer)


class KeptChoices:
    """A block's choices settled as arrays: cell v's is that of the cell it keeps (`monotone`), read when asked."""

    __slots__ = ("chosen", "source")

    def __init__(self, chosen: list[LayoutChoice | None], source: np.ndarray) -> None:
        self.chosen, self.source = chosen, source

    def __getitem__(self, v: int) -> LayoutChoice | None:
        return self.chosen[int(self.source[v])]


def monotone(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`need.settle`'s pass on an array: the running minimum, and per cell the cell whose choice it keeps. A cell
    keeps its own unless a smaller v is strictly cheaper, so that is the last cell at or before it that is no
    more than every cell before it."""
    cells = len(values)
    least = np.minimum.accumulate(values)
    own = np.ones(cells, dtype=bool)
    np.less_equal(values[1:], least[:-1], out=own[1:])
    return least, np.maximum.accumulate(np.where(own, np.arange(cells), 0))


def settle_block(vector: list[int], chosen: list[LayoutChoice | None], num_devices: int) -> BlockSol:
    """A fork/join block's vector made non-increasing (a cell takes the cell below, and its choice, where that is
    strictly cheaper) and capped at the devices (`ForkJoinSolver._solve`): cell by cell, or from ARRAY_CELLS on
    as arrays, which also gives the array a row of that many cells reads (`BlockSol.array`), the choices then
    read when asked (`KeptChoices`: only a plan's cells are)."""
    if len(vector) >= ARRAY_CELLS:
        least, source = monotone(np.array(vector, dtype=np.int64))
        capped = np.where(least <= num_devices, least, BIG)
        return BlockSol(capped.tolist(), KeptChoices(chosen, source), cached=capped)
    for v in range(1, len(vector)):
        if vector[v - 1] < vector[v]:
            vector[v], chosen[v] = vector[v - 1], chosen[v - 1]
    return BlockSol([c if c <= num_devices else BIG for c in vector], chosen)


def row_for(cells: int, segments: Segments, span: int, unit: int) -> ListRow | ArrayRow:
    """A fresh row of `cells` cells holding its segments, in the form that is cheaper at that many cells."""
    return ArrayRow(cells, segments, span, unit) if cells >= ARRAY_CELLS else ListRow(cells, segments, span, unit)
