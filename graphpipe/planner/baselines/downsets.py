"""The downsets (ideals) of a unit DAG as bitsets, enumerated within Piper's two budgets.

A downset holds every predecessor of each of its units. Each is a row of uint64 words (bit i: unit i
in topological order). They are built unit by unit in topological order: every partial set made of
the first i units may take unit i when it holds all of i's predecessors, so no set is found twice
and each step is one numpy operation over all partial sets. The partial sets only grow in number,
so once they reach `max_explored` the whole count is known to be at least that and the search
stops early (the exploration limit of the original Piper, `algo.cpp`); a complete count above
`max_downsets` gives up with that count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from graphpipe.errors import PlanningError
from graphpipe.graph.sp import StageUnits
from graphpipe.planner.baselines.advice import smaller_graph_advice

WORD = 64


@dataclass(frozen=True)
class Downsets:
    """`words[d]`: the bitset of downset d; ids sorted largest first (id 0: every unit, last: none)."""

    words: np.ndarray  # (count, num_words) uint64
    num_units: int

    def __len__(self) -> int:
        return len(self.words)

    @cached_property
    def members(self) -> np.ndarray:
        """(count, num_units) bool: which units each downset holds."""
        bits = np.unpackbits(self.words.view(np.uint8), axis=1, bitorder="little")
        return bits[:, : self.num_units].astype(bool)

    def subsets_of(self, upper: int) -> np.ndarray:
        """Ids of the downsets strictly inside downset `upper` (ascending)."""
        outside = ~self.words[upper]
        inside = ~np.any(self.words & outside, axis=1)
        inside[upper] = False
        return np.flatnonzero(inside)

    def supersets_of(self, lower: int) -> np.ndarray:
        """Ids of the downsets strictly holding downset `lower` (ascending: largest first)."""
        need = self.words[lower]
        holds = np.all(self.words & need == need, axis=1)
        holds[lower] = False
        return np.flatnonzero(holds)

    def as_ints(self) -> list[int]:
        """The downsets as Python int bitmasks, largest first."""
        return [sum(int(word) << (WORD * idx) for idx, word in enumerate(row)) for row in self.words]


def unit_pred_words(units: StageUnits) -> np.ndarray:
    """(units, words) uint64: the predecessors of each unit as a bitset."""
    pos = {key: idx for idx, key in enumerate(units.keys)}
    need = np.zeros((len(units.keys), num_words(len(units.keys))), dtype=np.uint64)
    for idx, key in enumerate(units.keys):
        for pred in units.preds[key]:
            need[idx, pos[pred] // WORD] |= np.uint64(1 << pos[pred] % WORD)
    return need


def num_words(num_units: int) -> int:
    return max(1, -(-num_units // WORD))


def find_downsets(units: StageUnits, *, max_downsets: int, max_explored: int, deadline: float,
                  graph_name: str, granularity: str = "op") -> Downsets:
    """Every downset of `units` (Piper's budgets: the module docstring), largest first."""
    need = unit_pred_words(units)
    found = np.zeros((1, need.shape[1]), dtype=np.uint64)
    for idx in range(len(units.keys)):
        takes = np.all(found & need[idx] == need[idx], axis=1)
        grown = found[takes]
        grown[:, idx // WORD] |= np.uint64(1 << idx % WORD)
        found = np.concatenate([found, grown])
        if len(found) >= max_explored or time.perf_counter() > deadline:
            raise PlanningError(give_up_message(graph_name, len(units.keys), len(found), max_downsets,
                                                max_explored, complete=False, granularity=granularity))
    if len(found) > max_downsets:
        raise PlanningError(give_up_message(graph_name, len(units.keys), len(found), max_downsets, max_explored,
                                            complete=True, granularity=granularity))
    sizes = np.bitwise_count(found).sum(axis=1, dtype=np.int64)
    return Downsets(words=found[np.argsort(-sizes, kind="stable")], num_units=len(units.keys))


def give_up_message(graph_name: str, num_units: int, count: int, max_downsets: int, max_explored: int, *,
                    complete: bool, granularity: str = "op") -> str:
    found = (f"{count:,} downsets" if complete
             else f"at least {count:,} downsets (counting stopped past {max_explored:,})")
    return (f"piper: no strategy within {max_downsets} downsets: graph {graph_name!r} ({num_units} units) has "
            f"{found}; Piper's DP runs over every downset, and their number grows exponentially with the number "
            "of parallel branches. Raise --max-downsets / --max-explored (PlanOptions.max_downsets, max_explored), "
            f"or {smaller_graph_advice(granularity)}")
