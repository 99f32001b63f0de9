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

    def answer(self) -> tuple[float, int]:
        """(bottleneck TPS, column) of the whole graph on every device, from the empty downset (the last state)."""
        row = self.best[-1, -1, 1:]
        column = int(np.argmin(row)) + 1
        return float(row[column - 1]), column


def dp_pass(pairs: StagePairs, costs: Mapping[int, StageCosts], keep: Mapping[int, np.ndarray],
            levels: list[tuple[int, int]], shape: tuple[int, int, int], check: Callable[[int], None]) -> DpTables:
    """One DP over the states, largest downset first, with the stages `keep` admits; `levels` are the pair ranges
    of the states of each size; `check(i)` runs before each (the deadline). No choices are recorded: `chain`
    finds them again from the table, which halves the work of a step."""
    best = np.full(shape, np.inf)
    best[0] = 0.0  # the whole graph: nothing left to stage
    for lo, hi in levels:
        check(int(pairs.lowers[lo]) if hi > lo else 0)
        for degree, stage in costs.items():
            chosen = np.flatnonzero(keep[degree][lo:hi]) + lo
            step = max(1, CHUNK_CELLS // (shape[1] * shape[2]))
            for start in range(0, len(chosen), step):
                _relax(best, pairs, chosen[start : start + step], stage, degree)
    return DpTables(best=best)


def _candidates(best: np.ndarray, uppers: np.ndarray, tps: np.ndarray, cap: np.ndarray, degree: int) -> np.ndarray:
    """(pairs, devices + 1 - degree, columns): each stage J \\ I on `degree` devices before the best of the rest
    past J, for every device count and column of the table of I (column 0 left out)."""
    size_m, last = best.shape[1], best.shape[2] - 1
    rest = best[uppers, : size_m - degree]
    shifted = rest[:, :, :last]  # column k of the new stage reads column k - 1 of the rest ...
    np.minimum(shifted[:, :, -1], rest[:, :, last], out=shifted[:, :, -1])  # ... and the last reads the last two
    candidate: np.ndarray = np.maximum(shifted, tps[:, None, None])
    columns = np.arange(1, last + 1)
    limited = cap < last
    if limited.any():
        candidate[limited] = np.where(columns[None, None, :] > cap[limited, None, None], np.inf, candidate[limited])
    return candidate


def _relax(best: np.ndarray, pairs: StagePairs, chosen: np.ndarray, stage: StageCosts, degree: int) -> None:
    """`chain_dp.relax` for many pairs at once: the best per lower state I (pairs come sorted by I)."""
    lowers = pairs.lowers[chosen]
    candidate = _candidates(best, pairs.uppers[chosen], stage.tps_ms[chosen], stage.in_flight_cap[chosen], degree)
    starts = np.flatnonzero(np.r_[True, lowers[1:] != lowers[:-1]])
    low = np.minimum.reduceat(candidate, starts, axis=0)
    states = lowers[starts]
    best[states, degree:, 1:] = np.minimum(low, best[states, degree:, 1:])


def chain(tables: DpTables, pairs: StagePairs, costs: Mapping[int, StageCosts], states: tuple[int, ...],
          num_devices: int) -> list[tuple[int, int]]:
    """The stages of the answer as (units bitmask, degree), first stage first: at each state, a stage whose
    candidate equals the table's entry (the same operations on the same numbers, so equal bits)."""
    best = tables.best
    value, column = tables.answer()
    last = best.shape[2] - 1
    found, lower, devices = [], len(states) - 1, num_devices
    while lower != 0:
        mine = np.arange(pairs.offsets[lower], pairs.offsets[lower + 1])
        upper, degree = _attaining(best, pairs, costs, mine, devices, column, value)
        found.append((states[upper] & ~states[lower], degree))
        lower, devices = upper, devices - degree
        if column < last or best[upper, devices, last - 1] < best[upper, devices, last]:
            column -= 1
        value = float(best[lower, devices, column])
    return found


def _attaining(best: np.ndarray, pairs: StagePairs, costs: Mapping[int, StageCosts], mine: np.ndarray,
               devices: int, column: int, value: float) -> tuple[int, int]:
    """(upper state, degree) of a stage after which the rest attains `value` at (devices, column)."""
    for degree, stage in costs.items():
        if degree > devices:
            continue
        candidate = _candidates(best, pairs.uppers[mine], stage.tps_ms[mine], stage.in_flight_cap[mine], degree)
        hits = np.flatnonzero(candidate[:, devices - degree, column - 1] == value)
        if len(hits):
            return int(pairs.uppers[mine[hits[0]]]), degree
    raise AssertionError(f"no stage attains {value} at {devices} devices, column {column}")
