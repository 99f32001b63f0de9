"""The parallel DP of a block of many branches, over runs of its sorted branches, as arrays.

With more than MAX_ENUMERATED_BRANCHES branches (`ParInfo.interval`) a group is a run [g, s) of
consecutive sorted branches, and the sub-problems are the suffixes [p, n) of the sorted order,
or, for `Probe.joined`, its prefixes [0, s). With F[g, s] the fewest devices on which run [g, s)
merged into one stage meets the target and holds k_after + 1 micro-batches (BIG where none) and
c_p the need vector of branch p staged as its chain, `Probe._solve_par`'s recurrence reads

    suffixes:  S[n] = base;  S[p][v] = min(c_p[v] + S[p + 1][v],  min over s >= p + 2 of F[p, s] + S[s][v])
    prefixes:  P[0] = base;  P[s][v] = min(min over g <= s - 2 of F[g, s] + P[g][v],  c_{s-1}[v] + P[s - 1][v])

for v > k_after (BIG below), capped at the devices. In the suffixes, the runs after one that fits
on no degree are not tried (each holds that run: more compute, traffic and memory, never fewer
devices), so F is BIG from there on. Each sub-problem is one numpy minimum over all its runs and
cells at once, where a loop per run and cell costs a Python step each: with 14 branches and 32
devices that loop was about half of a probe.

The loop recorded a choice per cell; here the choices are found again only for the cells the
stages are rebuilt from (`RunSol.pick`): the first candidate, in the loop's order (shortest run
first in the suffixes, longest first in the prefixes), whose cost is the cell's value, which is
what the loop's strict improvements kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphpipe.planner.sp_dp.blocks import BIG, merged_runs
from graphpipe.planner.sp_dp.need import GroupChoice


def fewest_per_run(tps: np.ndarray, k_max: np.ndarray, degrees: tuple[int, ...], target_ms: float, held: int,
                   cut_after_first_miss: bool) -> np.ndarray:
    """F[g, s]: the fewest degree on which run [g, s) (s >= g + 2) meets the target and holds `held` (BIG where
    none, and for s < g + 2), from its per-degree (TPS, most in flight) (`SizeTables.run_options`, degrees
    last). With `cut_after_first_miss`, BIG also past the first run of each start that fits on no degree."""
    meets = tps <= target_ms
    meets &= k_max >= held
    fewest = np.where(meets.any(axis=2), np.array(degrees, dtype=np.int64)[meets.argmax(axis=2)], BIG)
    runs = merged_runs(fewest.shape[0])
    if cut_after_first_miss:
        missed = fewest >= BIG
        missed &= runs
        fewest[np.logical_or.accumulate(missed, axis=1)] = BIG
    fewest[~runs] = BIG
    return fewest


@dataclass(slots=True)
class RunSol:
    """The sub-problems' need vectors (row p: suffix [p, n), or prefix [0, p) with `prefixes`) and what a choice
    is found again from: the merged runs' devices and the branches' chain vectors."""

    rows: np.ndarray
    fewest: np.ndarray
    chains: np.ndarray
    prefixes: bool

    def need(self) -> dict[int, list[int]]:
        """The rows by the bit mask of their branches (sorted order), as `ParSol.need`."""
        count = len(self.chains)
        full = (1 << count) - 1
        rows = self.rows.tolist()
        if self.prefixes:
            return {(1 << size) - 1: rows[size] for size in range(count + 1)}
        return {full & ~((1 << pos) - 1): rows[pos] for pos in range(count + 1)}

    def pick(self, mask: int, v: int) -> GroupChoice:
        """The group the loop would have chosen for cell v of sub-problem `mask`: (run, devices), devices 0 for one
        branch staged as its chain."""
        rows, fewest, chains = self.rows, self.fewest, self.chains
        if self.prefixes:
            stop = mask.bit_length()
            value = rows[stop, v]
            for start in range(stop - 1):
                if fewest[start, stop] + rows[start, v] == value:
                    return (1 << stop) - (1 << start), int(fewest[start, stop])
            assert chains[stop - 1, v] + rows[stop - 1, v] == value, "no group meets the cell"
            return 1 << (stop - 1), 0
        start = (mask & -mask).bit_length() - 1
        value = rows[start, v]
        if chains[start, v] + rows[start + 1, v] == value:
            return 1 << start, 0
        for stop in range(start + 2, len(chains) + 1):
            if fewest[start, stop] + rows[stop, v] == value:
                return (1 << stop) - (1 << start), int(fewest[start, stop])
        raise AssertionError("no group meets the cell")


def solve_runs(fewest: np.ndarray, chains: np.ndarray, base: list[int], k_after: int, num_devices: int,
               prefixes: bool) -> RunSol:
    """The recurrence of the module docstring: `fewest` from `fewest_per_run`, `chains[p]` branch p's chain need
    vector given k_after, `base` the empty set's vector.

    Every candidate reads its sub-problems at its own cell v only, so the rows are left uncapped and unmasked
    while they are filled and capped once at the end: a candidate through a value above the devices costs
    more than the devices either way, and a cell the cap makes BIG is BIG either way."""
    count = len(chains)
    width = len(base)
    weights = np.empty((count + 1, count + 1, width), dtype=np.int64)  # [g, s]: run [g, s)'s vector
    weights[...] = fewest[:, :, None]
    weights[np.arange(count), np.arange(1, count + 1)] = chains
    rows = np.empty((count + 1, width), dtype=np.int64)
    empty = 0 if prefixes else count
    rows[empty] = base
    for at in (range(1, count + 1) if prefixes else range(count - 1, -1, -1)):
        if prefixes:  # the runs [g, at) after prefix [0, g)
            np.minimum.reduce(weights[:at, at] + rows[:at], axis=0, out=rows[at])
        else:  # the runs [at, s) before suffix [s, n)
            np.minimum.reduce(weights[at, at + 1:] + rows[at + 1:], axis=0, out=rows[at])
    filled = np.arange(count + 1) != empty
    rows[filled, :k_after + 1] = BIG
    rows[rows > num_devices] = BIG
    return RunSol(rows=rows, fewest=fewest, chains=chains, prefixes=prefixes)
