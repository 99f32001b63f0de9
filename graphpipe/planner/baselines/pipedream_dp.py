"""PipeDream's DP over the antichain DAG's states, with graphpipe's 1F1B memory check on a chain.

As `compute_partitioning` in pipedream's `optimizer/optimizer_graph_hierarchical.py`: a chain of stages
J \\ I between states that precede one another, each replicated over its own number of devices,
minimising the slowest stage. The table is `chain_dp.py`'s: best[i][m, k] is the smallest bottleneck
TPS that stages the units past state i on at most m devices in at most k stages, a stage followed by
k - 1 stages keeping k micro-batches in flight. The last column K is one more than any stage's limit on
micro-batches in flight (memory), so it counts any number of stages and takes only unlimited stages; the
answer is the best column.

States of equal size never precede one another, so all states of one size are relaxed at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from graphpipe.planner.baselines.pipedream_tables import StageCosts, StagePairs

CHUNK_CELLS = 1 << 22  # table cells relaxed at once (bounds the memory of one step)


@dataclass(frozen=True, slots=True)
class DpTables:
    best: np.ndarray  # (states, devices + 1, columns + 1)
    choice: np.ndarray  # upper state * (devices + 1) + degree of the stage chosen at each cell

    def answer(self) -> tuple[float, int]:
        """(bottleneck TPS, column) of the whole graph on every device, from the empty downset (the last state)."""
        row = self.best[-1, -1, 1:]
        column = int(np.argmin(row)) + 1
        return float(row[column - 1]), column


def dp_pass(pairs: StagePairs, costs: Mapping[int, StageCosts], keep: Mapping[int, np.ndarray],
            levels: list[tuple[int, int]], shape: tuple[int, int, int], check: Callable[[int], None]) -> DpTables:
    """One DP over the states, largest downset first, with the stages `keep` admits; `levels` are the pair ranges
    of the states of each size; `check(i)` runs before each (the deadline)."""
    best = np.full(shape, np.inf)
    best[0] = 0.0  # the whole graph: nothing left to stage
    choice = np.zeros(shape, dtype=np.int64)
    for lo, hi in levels:
        check(int(pairs.lowers[lo]) if hi > lo else 0)
        for degree, stage in costs.items():
            chosen = np.flatnonzero(keep[degree][lo:hi]) + lo
            step = max(1, CHUNK_CELLS // (shape[1] * shape[2]))
            for start in range(0, len(chosen), step):
                _relax(best, choice, pairs, chosen[start : start + step], stage, degree)
    return DpTables(best=best, choice=choice)


def _relax(best: np.ndarray, choice: np.ndarray, pairs: StagePairs, chosen: np.ndarray, stage: StageCosts,
           degree: int) -> None:
    """`chain_dp.relax` for many pairs at once: each stage J \\ I on `degree` devices before the rest past J,
    the best per lower state I (pairs come sorted by I)."""
    uppers, lowers = pairs.uppers[chosen], pairs.lowers[chosen]
    tps, cap = stage.tps_ms[chosen], stage.in_flight_cap[chosen]
    size_m, last = best.shape[1], best.shape[2] - 1
    rest = best[uppers, : size_m - degree]
    shifted = rest[:, :, :last]  # column k of the new stage reads column k - 1 of the rest ...
    np.minimum(shifted[:, :, -1], rest[:, :, last], out=shifted[:, :, -1])  # ... and the last reads the last two
    candidate = np.maximum(shifted, tps[:, None, None])
    columns = np.arange(1, last + 1)
    limited = cap < last
    if limited.any():
        candidate[limited] = np.where(columns[None, None, :] > cap[limited, None, None], np.inf, candidate[limited])
    starts = np.flatnonzero(np.r_[True, lowers[1:] != lowers[:-1]])
    low = np.minimum.reduceat(candidate, starts, axis=0)
    hit = candidate == np.repeat(low, np.diff(np.r_[starts, len(chosen)]), axis=0)
    first = np.minimum.reduceat(np.where(hit, np.arange(len(chosen))[:, None, None], len(chosen) - 1), starts, axis=0)
    states = lowers[starts]
    region = best[states, degree:, 1:]
    better = low < region
    if better.any():
        best[states, degree:, 1:] = np.where(better, low, region)
        tags = uppers[first].astype(np.int64) * size_m + degree
        choice[states, degree:, 1:] = np.where(better, tags, choice[states, degree:, 1:])


def chain(tables: DpTables, states: tuple[int, ...], num_devices: int) -> list[tuple[int, int]]:
    """The stages of the answer as (units bitmask, degree), first stage first."""
    _, column = tables.answer()
    last = tables.best.shape[2] - 1
    found, lower, devices = [], len(states) - 1, num_devices
    while lower != 0:
        upper, degree = divmod(int(tables.choice[lower, devices, column]), num_devices + 1)
        found.append((states[upper] & ~states[lower], degree))
        lower, devices = upper, devices - degree
        if column < last or tables.best[upper, devices, last - 1] < tables.best[upper, devices, last]:
            column -= 1
    return found
