"""Need vectors, the records of what the DP chose, and the chain step that writes and settles a row.

A *need vector* of a DP sub-problem holds, per v = 0 .. devices + 1,

    need[v] = fewest devices with which the sub-problem can be staged so that its entry stages
              hold at most v micro-batches in flight (BIG: not within the devices),

and is non-increasing in v once settled (allowing more in flight never costs devices). Beside
each cell the DP records what it chose (`choice`), so that the stages are rebuilt by walking the
choices from the tree's entry (`Probe.stages`). The records are plain tuples with a kind tag in
front: the types below name their fields at no run-time cost in the DP's hot loops.

One chain step (a row of a chain, `Probe._solve_chain`) is: write every candidate into the row
(segments with `write_segments`, then the parallel item or fork/join blocks starting there), then
`settle` it; a row where items start is built by `rows`, as lists or, with many cells, as arrays.
A row where no block starts holds only segments, in the few cells where the rest's
vectors drop (a median of 3 of 1,027 cells on a 128-layer transformer at 1,024 devices), and
`settle_segments` builds it settled in one pass over those cells, appending the runs between
them whole: the same row, choices and breakpoints (`tests/planner/test_need.py` proves it on
random rows), in time that grows with the cells written, not with the devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Final, Literal, Protocol, TypeVar

import numpy as np

from graphpipe.planner.sp_dp.blocks import BIG

T_co = TypeVar("T_co", covariant=True)

NO_KEY: Final = 1 << 62  # above every cell key (`size_tables.SegmentOffers`): no segment offer for the cell

SEG: Final = 0  # the row's first stage is a segment of the chain
OPEN: Final = 1  # the row starts with its parallel item, solved as a plain parallel block
BLOCK: Final = 2  # the row starts with a fork/join block (`fork_join`)
JOINED: Final = 3  # the row starts with its parallel item, whose join run's stage takes its lightest branches whole

ItemKind = Literal[1, 2, 3]  # OPEN, BLOCK or JOINED

SegChoice = tuple[Literal[0], int, int, int]
"""(SEG, stop, d1, u): items [start, stop) as one stage on d1 devices, then row `stop` at cell u (= v - 1)."""
ItemChoice = tuple[ItemKind, bool, int, int]
"""(OPEN, BLOCK or JOINED, with_join, k_after, v): the parallel item (OPEN; with_join False), the fork/join block
starting at the row (BLOCK, with or without its join run) or the parallel item and its join run (JOINED; with_join
True) at its cell v, given k_after in flight after it; then the row after it at cell k_after."""
ChainChoice = SegChoice | ItemChoice
GroupChoice = tuple[int, int]
"""(group, devices): a parallel block's branches in the bit mask `group` (sorted order) as one chain if it is a
single branch (devices 0: the branch's own choices say), else merged into one stage on `devices` devices."""
JoinedChoice = tuple[int, int]
"""(start, devices): the join run's stage takes the sorted branches from `start` on, on `devices` devices; the
branches before `start` feed it, grouped as a parallel block's."""
ForkPick = tuple[int, int, int]
"""(stop, d1, u): a fork's stage is items [0, stop) of its lane on d1 devices; the rest of the block at cell u."""


@dataclass(frozen=True, slots=True)
class Layout:
    """How a fork/join block is staged: which branch (by sorted position) takes the fork run and which the
    join run; or a merge stage: the items where the two branches' tails start and the devices of J's stage."""

    rf: int | None
    rj: int | None
    merge: tuple[int, int, int] | None = None  # (s_0, s_1, devices)


LayoutChoice = tuple[Layout, ForkPick | None]
"""(layout, fork pick): the block's layout, and where its fork's stage ends (None: no fork run)."""


class ByCell(Protocol[T_co]):
    """What a vector's choices are read as, by cell: a list, or decoded on demand (`rows`)."""

    def __getitem__(self, v: int, /) -> T_co: ...


CellChoices = ByCell[ChainChoice | None]


@dataclass(slots=True)
class ChainSol:
    """Suffix need vectors of one chain (rows by start item), their choices and their breakpoints."""

    need: list[list[int]]
    choice: list[CellChoices]
    breaks: list[list[tuple[int, int]]]  # per row, its breakpoints (all feasible: the rows are settled)


@dataclass(slots=True)
class ParSol:
    """Need vectors of a parallel block's branch subsets (bit masks, `full` = every branch) and their choices:
    recorded per cell (`choice`), or found again on demand by `pick` (`runs.RunSol.pick`)."""

    need: dict[int, list[int]]
    choice: dict[int, list[GroupChoice | None]]
    full: int
    pick: Callable[[int, int], GroupChoice] | None = None

    def chosen(self, mask: int, v: int) -> GroupChoice | None:
        """The choice of cell v of sub-problem `mask`."""
        return self.pick(mask, v) if self.pick is not None else self.choice[mask][v]


@dataclass(slots=True)
class JoinedSol:
    """A parallel block with its join run's stage taking its lightest branches (`Probe.joined`): the need vector
    (capped at the devices) and, per cell, which branches that stage takes."""

    need: list[int]
    choice: list[JoinedChoice | None]


@dataclass(slots=True)
class BlockSol:
    """A fork/join block's need vector (settled and capped at the devices) and its choices."""

    need: list[int]
    choice: ByCell[LayoutChoice | None]
    cached: np.ndarray | None = None  # `need` as an array, once made

    def array(self) -> np.ndarray:
        """The need vector as an array, made once: what a row of many cells reads (`rows.ArrayRow`)."""
        if self.cached is None:
            self.cached = np.array(self.need, dtype=np.int64)
        return self.cached


@dataclass(frozen=True, slots=True)
class CellRuns:
    """The runs of cells over which every vector of some tables of need vectors is constant. A sum of such
    vectors is constant there too, so it is computed once per run instead of once per cell: the merge
    stages' floors and sides (`fork_join`) on two towers of 32 layers at op level on 1,024 devices are
    5-7 runs of 1,026 cells, on 256 x 256 pairs of tails."""

    starts: np.ndarray  # the first cell of each run
    lengths: np.ndarray

    @classmethod
    def of(cls, vectors: Sequence[np.ndarray], cells: int) -> CellRuns:
        """The runs of `vectors` (tables of rows of `cells` cells each)."""
        changes = np.zeros(cells, dtype=bool)
        changes[0] = True
        for table in vectors:
            if len(table):
                changes[1:] |= (table[:, 1:cells] != table[:, :cells - 1]).any(axis=0)
        starts = np.flatnonzero(changes)
        return cls(starts, np.diff(np.append(starts, cells)))

    def first(self, table: np.ndarray) -> np.ndarray:
        """Each run's first cell of every row of `table` (its cells are the last axis)."""
        return np.asarray(table[..., self.starts])

    def most(self, cells: np.ndarray) -> np.ndarray:
        """The largest value of `cells` over each run."""
        return np.asarray(np.maximum.reduceat(cells, self.starts))

    def expand(self, runs: np.ndarray) -> np.ndarray:
        """Per-run values (last axis) back to one per cell."""
        return np.repeat(runs, self.lengths, axis=-1)


def breakpoints(need: list[int]) -> list[tuple[int, int]]:
    """(v, devices) where a non-increasing need vector drops."""
    out, last = [], BIG
    for v, devices in enumerate(need):
        if devices < last:
            out.append((v, devices))
            last = devices
    return out


def feasible_breakpoints(need: list[int], num_devices: int) -> list[tuple[int, int]]:
    """Breakpoints of a need vector that fit on the devices."""
    return [point for point in breakpoints(need) if point[1] <= num_devices]


def feasible_breakpoints_of_rows(needs: np.ndarray, num_devices: int) -> list[list[tuple[int, int]]]:
    """`feasible_breakpoints` of every row of a table of non-increasing need vectors, read off at once."""
    before = np.concatenate((np.full((len(needs), 1), BIG, dtype=needs.dtype), needs[:, :-1]), axis=1)
    rows, cells = np.nonzero((needs < before) & (needs <= num_devices))
    out: list[list[tuple[int, int]]] = [[] for _ in range(len(needs))]
    for row, cell, devices in zip(rows.tolist(), cells.tolist(), needs[rows, cells].tolist()):
        out[row].append((cell, devices))
    return out


def write_segments(best: list[int], written: list[int], span: int, unit: int, row: list[int],
                   chosen: list[ChainChoice | None]) -> None:
    """Write the best segment of each cell into the row: `best[u]` is NO_KEY or the cell key of cell u + 1,
    (devices in all) * unit + d1 * span + stop (`size_tables.SegmentOffers`), unpacked here; `written` lists
    the u whose key is not NO_KEY, in any order."""
    for u in written:
        cost, rest_key = divmod(best[u], unit)
        d1, stop = divmod(rest_key, span)
        row[u + 1], chosen[u + 1] = cost, (SEG, stop, d1, u)


def settle(row: list[int], chosen: list[ChainChoice | None], num_devices: int) -> list[tuple[int, int]]:
    """Make a chain row non-increasing, need[v] = min(need[v], need[v - 1]) (a cell keeps its own choice
    unless a smaller v is strictly cheaper), mark what needs more than the devices infeasible (BIG), and
    return the row's feasible breakpoints."""
    out: list[tuple[int, int]] = []
    last = previous = BIG
    for v, devices in enumerate(row):
        if previous < devices:
            devices = previous
            chosen[v] = chosen[v - 1]
        previous = devices
        if devices > num_devices:
            row[v] = BIG
        else:
            row[v] = devices
            if devices < last:
                out.append((v, devices))
                last = devices
    return out


def settle_segments(best: list[int], written: list[int], span: int, unit: int, num_devices: int,
                    cells: int) -> tuple[list[int], list[ChainChoice | None], list[tuple[int, int]]]:
    """The row, choices and breakpoints that `write_segments` then `settle` make of a fresh row (every cell
    BIG, no choice) of `cells` cells, built from the written cells alone. Between two written cells a
    settled row repeats the first one's need and choice (an unwritten cell is BIG, so the smaller v is
    strictly cheaper), so each run is appended whole; a written cell keeps its own choice unless an
    earlier one is strictly cheaper, and only a written cell can be a breakpoint."""
    out: list[tuple[int, int]] = []
    at = sorted(written)
    first = at[0] + 1 if at else cells
    row = [BIG] * first
    chosen: list[ChainChoice | None] = [None] * first
    last = previous = BIG
    kept: ChainChoice | None = None
    for u, stop_at in zip(at, [*at[1:], cells - 1]):
        cost, rest_key = divmod(best[u], unit)
        if cost <= previous:
            d1, stop = divmod(rest_key, span)
            previous, kept = cost, (SEG, stop, d1, u)
        devices = BIG if previous > num_devices else previous
        row.extend(repeat(devices, stop_at - u))
        chosen.extend(repeat(kept, stop_at - u))
        if devices < last:
            out.append((u + 1, devices))
            last = devices
    return row, chosen, out


def add(a: list[int], b: list[int]) -> list[int]:
    """Two parts side by side: their need vectors add (each part's entries hold at most v)."""
    return [x + y for x, y in zip(a, b)]


def drops(need: list[int]) -> list[int]:
    """Where a need vector drops (v = 0 included)."""
    out, last = [], -1
    for v, devices in enumerate(need):
        if devices != last:
            out.append(v)
            last = devices
    return out


def sum_breakpoints(row: list[int], row_breaks: list[tuple[int, int]], side: list[int],
                    side_drops: list[int]) -> list[tuple[int, int]]:
    """`breakpoints` of row + side, two need vectors (non-increasing): their sum drops only where one of them
    does, so only the row's breakpoints (where it drops to a feasible count, the rest of it being
    infeasible) and the side's drops are read, not every v."""
    out, last = [], BIG
    for v in sorted([v for v, _ in row_breaks] + side_drops):
        devices = row[v] + side[v]
        if devices < last:
            out.append((v, devices))
            last = devices
    return out
