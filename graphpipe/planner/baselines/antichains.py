"""PipeDream's antichain DAG of the unit DAG (pipedream, `graph/graph.py`: `Graph.antichain_dag`).

A state of PipeDream's optimizer is an antichain of units, standing for the downset it closes (the
antichain and all its predecessors). From a state the original steps to the antichains that also
close one more unit y past it (a successor of its augmented antichain): the old downset plus y and
all of y's predecessors. An input node before every source unit (the original's input layer) is the
first state, the empty downset; so every downset of the unit DAG is a state, and state I precedes
state J in the antichain DAG exactly when I ⊂ J (the original's `all_predecessor_ids`).

The number of states grows exponentially with the graph's width, so the enumeration stops at a
deadline or a state count and says how far it got.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from graphpipe.graph.sp import StageUnits

CHECK_EVERY = 256  # states between two looks at the clock


class AntichainLimitError(Exception):
    """The antichain DAG outgrew the deadline or the state budget; `num_states` were built."""

    def __init__(self, num_states: int) -> None:
        super().__init__(num_states)
        self.num_states = num_states


@dataclass(frozen=True, slots=True)
class AntichainDag:
    """The states as downsets (bitmasks over unit positions), largest first: every state comes after all
    the states it precedes in the antichain DAG (a reverse topological order)."""

    states: tuple[int, ...]
    num_units: int


def antichain_dag(units: StageUnits, deadline: float, max_states: int) -> AntichainDag:
    """Breadth first from the input node, as the original: each state moves to the downsets that close one
    unit more. Raises AntichainLimitError past `deadline` (perf_counter) or `max_states`."""
    pos = {key: idx for idx, key in enumerate(units.keys)}
    preds = [sum(1 << pos[p] for p in units.preds[key]) for key in units.keys]
    closed = _principal_downsets(preds)
    seen = {0}
    frontier = [0]
    while frontier:
        grown: list[int] = []
        for state in frontier:
            for unit, need in enumerate(preds):
                # y is past the state and follows it: a source (after the input node) or a successor of a unit in it
                if state >> unit & 1 or (need and not need & state):
                    continue
                nxt = state | closed[unit]
                if nxt not in seen:
                    seen.add(nxt)
                    grown.append(nxt)
                    if len(seen) % CHECK_EVERY == 0 and (len(seen) > max_states or time.perf_counter() > deadline):
                        raise AntichainLimitError(len(seen))
        frontier = grown
    order = sorted(seen, key=lambda mask: (-mask.bit_count(), mask))
    return AntichainDag(states=tuple(order), num_units=len(preds))


def _principal_downsets(preds: list[int]) -> list[int]:
    """Each unit with all its predecessors; units come in topological order."""
    closed: list[int] = []
    for unit, need in enumerate(preds):
        mask = 1 << unit
        for idx in range(need.bit_length()):
            if need >> idx & 1:
                mask |= closed[idx]
        closed.append(mask)
    return closed
