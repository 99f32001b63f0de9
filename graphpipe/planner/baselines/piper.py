"""The Piper planner (docs/method.md §7): a DP over the downsets (ideals) of the unit DAG.

Downsets are taken over the graph's units (`graphpipe.graph.sp.stage_units`; at layer granularity a
whole layer is one unit, as in the original's layer graphs). A stage is the difference J \\ I of two
downsets I ⊂ J, so every stage is convex and the stages form a chain; each stage gets its own
data-parallel degree (a divisor of the micro-batch); a stage p-th from the end holds min(p, B / b)
micro-batches in flight (1F1B on a chain) beside 4 × its weights (`graphpipe.cost.formulas.memory`).

Budgets, as in the original Piper (msr-fiddle/piper, `algo.cpp`: IDEALS_LIMIT and
IDEALS_EXPLORATION_LIMIT): the downsets are counted first; once 200,000 (`max_explored`) are found
the search stops, and a graph with more than 40,000 (`max_downsets`) gives up before any DP runs,
saying how many it found. The number of downsets grows exponentially with the number of parallel
branches, which is why Piper cannot plan many-branch models. `time_limit_s` (default 600 s) is a
safety net; the budgets decide.

Speed (`best[I][m][c]`: the smallest bottleneck TPS of the units after downset I on at most m
devices in a chain of min(stages, K) = c stages, K = min(devices, B / b)): the downsets are bitsets,
stage costs are totals per downset (`piper_costs`), priced for all the stages of one level of
downsets (one size) at once per degree, and each upper downset J pushes its final table into all of
its sub-downsets I in one numpy operation per degree. Pruning keeps the optimum exact:
the optimum restricted to the prefixes of the topological order (a subset of Piper's space) bounds
it from above, so stages and table entries slower than that bound are skipped; only the rows of
J's table that improve on one device fewer are pushed, and each table is made non-increasing in m
before it is used, which restores the rows skipped.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from graphpipe.errors import PlanningError
from graphpipe.planner.baselines.downsets import WORD, Downsets, find_downsets, num_words
from graphpipe.planner.baselines.piper_costs import Boundary, StageTables, above, below, boundary, concat_traffic
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import divisors_up_to
from graphpipe.planner.stage_spec import Partition, StageSpec

DEFAULT_MAX_DOWNSETS = 40_000  # IDEALS_LIMIT of the original
DEFAULT_MAX_EXPLORED = 200_000  # IDEALS_EXPLORATION_LIMIT of the original
DEFAULT_TIME_LIMIT_S = 600.0
BOUND_SLACK = 1e-9  # the bound's stages, summed over other downsets, may cost a few ulps more


class Search:
    """One Piper search space: downsets, the traffic of every stage J \\ I, and a deadline.

    The stages are kept in one array, those of each upper downset J contiguous (`offsets`), and the
    uppers are grouped by size (`levels`): downsets of one size are never inside each other, so the DP
    prices a whole level's stages in one numpy operation per degree."""

    def __init__(self, request: PlanRequest, downsets: Downsets, edges: Boundary, deadline: float) -> None:
        self.request = request
        self.downsets = downsets
        self.edges = edges
        self.deadline = deadline
        parts = [below(downsets, edges, upper) for upper in range(len(downsets))]
        self.pairs = concat_traffic(parts)
        self.offsets = np.cumsum([0] + [len(part.lowers) for part in parts])
        sizes = downsets.members.sum(axis=1)
        starts = np.flatnonzero(np.diff(sizes)) + 1
        bounds = np.concatenate([[0], starts, [len(downsets)]])
        self.levels = [(int(lo), int(hi)) for lo, hi in itertools.pairwise(bounds)]

    def check_clock(self) -> None:
        if time.perf_counter() > self.deadline:
            limit_s = time_limit_s(self.request)
            raise PlanningError(f"piper: no strategy within {limit_s} s ({len(self.downsets):,} downsets); raise "
                                "--time-limit (PlanOptions.time_limit_s) or use planner 'graphpipe'")


def time_limit_s(request: PlanRequest) -> float:
    return request.options.time_limit_s or DEFAULT_TIME_LIMIT_S


def plan_piper(request: PlanRequest) -> list[Partition]:
    deadline = time.perf_counter() + time_limit_s(request)
    opts = request.options
    downsets = find_downsets(request.units, max_downsets=opts.max_downsets or DEFAULT_MAX_DOWNSETS,
                             max_explored=opts.max_explored or DEFAULT_MAX_EXPLORED, deadline=deadline,
                             graph_name=request.graph.name, granularity=request.granularity)
    edges = boundary(request)
    search = Search(request, downsets, edges, deadline)
    prefixes = Search(request, prefix_downsets(len(request.units.keys)), edges, deadline)
    found, size_done = [], request.size_steps("chains")
    for size in request.micro_batch_sizes:
        prefix_best = solve(prefixes, size, np.inf)  # None: no chain of prefixes fits, search without a bound
        bound = prefix_best[0] * (1 + BOUND_SLACK) if prefix_best is not None else np.inf
        best = solve(search, size, bound)
        if best is not None:
            found.append(Partition(stages=tuple(best[1]), sequential=True))
        if size_done is not None:
            size_done(size)
    return found


def prefix_downsets(num_units: int) -> Downsets:
    """The downsets made of the first i units in topological order (every unit first, none last)."""
    words = np.zeros((num_units + 1, num_words(num_units)), dtype=np.uint64)
    for count in range(num_units + 1):
        for idx in range(num_units - count):
            words[count, idx // WORD] |= np.uint64(1 << idx % WORD)
    return Downsets(words=words, num_units=num_units)


def solve(search: Search, size: int, bound: float) -> tuple[float, list[StageSpec]] | None:
    """The best chain of stages at micro-batch `size` (its bottleneck TPS and stages), or None if none fits;
    `bound` is at least the optimum (stages slower than it are skipped)."""
    request = search.request
    num_devices = request.num_devices
    max_stages = max(1, min(num_devices, request.global_batch_size // size))
    degrees = divisors_up_to(size, num_devices)
    tables = StageTables(request, search.downsets, size, degrees)
    best = np.full((len(search.downsets), num_devices + 1, max_stages + 1), np.inf)
    best[0, :, 0] = 0.0  # id 0 holds every unit: nothing left to stage
    offsets = search.offsets
    for start, stop in search.levels:
        search.check_clock()
        first = offsets[start]
        level = search.pairs.part(first, offsets[stop])
        stages = {degree: tables.stage(level, degree, max_stages) for degree in degrees}
        for upper in range(start, stop):
            np.minimum.accumulate(best[upper], axis=0, out=best[upper])
            mine = slice(offsets[upper] - first, offsets[upper + 1] - first)
            mine_stages = {degree: (tps[mine], k_max[mine]) for degree, (tps, k_max) in stages.items()}
            push(best, level.lowers[mine], mine_stages, upper, bound)
    ends = best[len(search.downsets) - 1, num_devices]
    value = float(ends.min())
    if not np.isfinite(value):
        return None
    fewest = int(np.flatnonzero(ends <= value * (1 + BOUND_SLACK))[0])  # of the optimal chains, the shallowest
    return value, trace(search, tables, best, degrees, fewest)


def push(best: np.ndarray, lowers: np.ndarray, stages: dict[int, tuple[np.ndarray, np.ndarray]], upper: int,
         bound: float) -> None:
    """Relax every stage upper \\ I (I in `lowers`, the sub-downsets of `upper`) with each degree: best[I]
    from best[upper]. `stages[degree]`: each stage's TPS and most micro-batches in flight."""
    table = best[upper]
    num_devices, max_stages = table.shape[0] - 1, table.shape[1] - 1
    useful = table <= bound
    if not useful.any() or not len(lowers):
        return
    rows_ok = np.flatnonzero(useful.any(axis=1))
    cols_ok = np.flatnonzero(useful.any(axis=0))
    low_col, high_col = min(cols_ok[0] + 1, max_stages), min(cols_ok[-1] + 1, max_stages)
    rest = table[:, low_col - 1: high_col].copy()  # target column c reads column c - 1 ...
    if high_col == max_stages:
        np.minimum(rest[:, -1], table[:, max_stages], out=rest[:, -1])  # ... and K reads K as well
    first = rows_ok[0]
    drops = np.flatnonzero(np.any(rest[first + 1:] < rest[first:-1], axis=1)) + first + 1
    rows = np.concatenate([[first], drops])
    columns = np.arange(low_col, high_col + 1)
    for degree, (tps, k_max) in stages.items():
        rows = rows[rows + degree <= num_devices]
        if not len(rows):
            return
        keep = np.flatnonzero((tps <= bound) & (k_max >= low_col))
        if not len(keep):
            continue
        cand = np.maximum(rest[rows][None, :, :], tps[keep, None, None])
        cand[np.broadcast_to((columns[None, :] > k_max[keep, None])[:, None, :], cand.shape)] = np.inf
        targets = lowers[keep][:, None]
        current = best[targets, rows[None, :] + degree, low_col: high_col + 1]
        best[targets, rows[None, :] + degree, low_col: high_col + 1] = np.minimum(current, cand)


def trace(search: Search, tables: StageTables, best: np.ndarray, degrees: tuple[int, ...],
          count: int) -> list[StageSpec]:
    """The stages of the best chain of `count` stages (min(stages, K)), from the first: at each downset, a
    stage that attains its table entry."""
    units = search.request.units.ops
    downsets = search.downsets
    max_stages = best.shape[2] - 1
    lower, devices = len(downsets) - 1, best.shape[1] - 1
    stages = []
    while lower != 0:
        pairs = above(downsets, search.edges, lower)
        value, step = np.inf, (0, 0, 0)
        for degree in degrees:
            if degree > devices:
                break
            tps, k_max = tables.stage(pairs, degree, max_stages)
            for before in (count - 1, count) if count == max_stages else (count - 1,):
                cand = np.maximum(tps, best[pairs.uppers, devices - degree, before])
                cand[k_max < count] = np.inf
                pick = int(np.argmin(cand))
                if cand[pick] < value:
                    value, step = float(cand[pick]), (int(pairs.uppers[pick]), degree, before)
        upper, degree, before = step
        stage = downsets.members[upper] & ~downsets.members[lower]
        ops = tuple(op for idx in np.flatnonzero(stage) for op in units[idx])
        stages.append(StageSpec(ops=ops, num_devices=degree, micro_batch_size=tables.size))
        lower, devices, count = upper, devices - degree, before
    return stages


def enumerate_downsets(request: PlanRequest, max_downsets: int, deadline: float) -> list[int]:
    """Every downset of the request's units as an int bitmask over unit positions, largest first."""
    return find_downsets(request.units, max_downsets=max_downsets, max_explored=max(DEFAULT_MAX_EXPLORED,
                              max_downsets + 1), deadline=deadline, graph_name=request.graph.name).as_ints()
