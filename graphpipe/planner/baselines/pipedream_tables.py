"""What PipeDream's stages cost: every pair of antichain-DAG states I ⊂ J, and the stage J \\ I between them.

The original tabulates compute time, activations and parameters per state (sums over its downset) and
costs a stage by subtracting two states (pipedream, `optimizer/optimizer_graph_hierarchical.py`:
`compute_times`, `activation_sizes`, `parameter_sizes`). So do these tables, with graphpipe's cost
model: fwd + bwd and activations at each per-device batch b / r the DP asks for, and weights. The
tensors crossing a stage's boundary do not subtract, so they are counted once per pair. TPS and the
in-flight cap then follow `CostModel.stage_cost`: the rule's twin (`graphpipe.cost.formulas.time_per_sample`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphpipe.cost.formulas.communication import p2p_ms_array
from graphpipe.cost.formulas.memory import max_in_flight_micro_batches_array
from graphpipe.cost.formulas.time_per_sample import time_per_sample_ms_array
from graphpipe.graph.sp import StageUnits
from graphpipe.planner.baselines.antichains import AntichainDag
from graphpipe.planner.stage_cost import CostModel

WORD = 64


@dataclass(frozen=True, slots=True)
class StagePairs:
    """The pairs in CSR form: those with lower state i are [offsets[i], offsets[i + 1])."""

    offsets: np.ndarray
    lowers: np.ndarray  # the state I of each pair
    uppers: np.ndarray  # the state J of each pair
    messages: np.ndarray  # tensors crossing J \ I, received and sent
    bytes_per_sample: np.ndarray


@dataclass(frozen=True, slots=True)
class StageCosts:
    """Per pair, its stage on r devices: TPS, and the most micro-batches in flight that fit (max_stages: any)."""

    tps_ms: np.ndarray
    in_flight_cap: np.ndarray  # int16


def state_words(dag: AntichainDag) -> np.ndarray:
    """The downsets as rows of 64-bit words."""
    num_words = max(1, -(-dag.num_units // WORD))
    low = (1 << WORD) - 1
    return np.array([[state >> (WORD * w) & low for w in range(num_words)] for state in dag.states], dtype=np.uint64)


class PairLimitError(Exception):
    """More stages (pairs of states) than `max_pairs`, found by the time `done` lower states were read."""

    def __init__(self, num_pairs: int, done: int) -> None:
        super().__init__(f"{num_pairs} pairs after {done} states")
        self.num_pairs = num_pairs
        self.done = done


def stage_pairs(dag: AntichainDag, model: CostModel, units: StageUnits, check: Callable[[int], None],
                max_pairs: int) -> StagePairs:
    """Every I ⊂ J with the tensors crossing J \\ I; `check(i)` runs before each lower state (the deadline).
    Past `max_pairs` pairs, PairLimitError."""
    words = state_words(dag)
    sizes = np.array([state.bit_count() for state in dag.states])
    first_of_size = {int(size): int(idx) for idx, size in reversed(list(enumerate(sizes)))}
    crossing = _crossing_ops(model, units, words.shape[1])
    uppers, messages, num_bytes, offsets = [], [], [], [0]
    for i in range(len(dag.states)):
        check(i)
        above = words[: first_of_size[int(sizes[i])]]  # larger downsets come first
        found = np.nonzero(np.all(above & words[i] == words[i], axis=1))[0]
        count, total = _boundary(words[found] & ~words[i], words[i], *crossing)
        uppers.append(found.astype(np.int32))
        messages.append(count)
        num_bytes.append(total)
        offsets.append(offsets[-1] + len(found))
        if offsets[-1] > max_pairs:
            raise PairLimitError(offsets[-1], i + 1)
    counts = np.diff(offsets)
    return StagePairs(offsets=np.array(offsets, dtype=np.int64),
                      lowers=np.repeat(np.arange(len(counts), dtype=np.int32), counts), uppers=np.concatenate(uppers),
                      messages=np.concatenate(messages), bytes_per_sample=np.concatenate(num_bytes))


def _crossing_ops(model: CostModel, units: StageUnits, num_words: int) -> tuple[np.ndarray, ...]:
    """Ops read outside their own unit: (word, bit) of their unit, their readers' units, output bytes per sample.
    Only these can cross a stage boundary made of whole units."""
    unit_of = {op: idx for idx, ops in enumerate(units.ops) for op in ops}
    rows: list[tuple[int, list[int], float]] = []
    for op, unit in unit_of.items():
        readers = {unit_of[s] for s in model.succs[op]}
        if readers - {unit}:
            mask = sum(1 << r for r in readers)
            rows.append((unit, [mask >> (WORD * w) & ((1 << WORD) - 1) for w in range(num_words)],
                         model.out_bytes_per_sample[op]))
    word = np.array([u // WORD for u, _, _ in rows], dtype=np.int64)
    bit = np.array([u % WORD for u, _, _ in rows], dtype=np.uint64)
    read_by = np.array([r for _, r, _ in rows], dtype=np.uint64).reshape(len(rows), num_words)
    weight = np.array([b for _, _, b in rows], dtype=np.float64)
    return word, bit, read_by, weight


def _boundary(stage: np.ndarray, lower: np.ndarray, word: np.ndarray, bit: np.ndarray, readers: np.ndarray,
              weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(messages, bytes per sample) of each stage (rows of unit words), as `CostModel.boundary`: an op outside
    the stage read inside is received, an op inside read outside is sent."""
    inside_lower = (lower[word] >> bit) & np.uint64(1) == 1
    settled = inside_lower & ~np.any(readers & ~lower, axis=1)  # in I, read only in I: never crosses
    word, bit, readers, weight = word[~settled], bit[~settled], readers[~settled], weight[~settled]
    inside = (stage[:, word] >> bit) & np.uint64(1) == 1  # (stages, ops)
    read_inside = np.any(stage[:, None, :] & readers[None, :, :], axis=2)
    read_outside = np.any(~stage[:, None, :] & readers[None, :, :], axis=2)
    crosses = (inside & read_outside) | (~inside & read_inside)
    return crosses.sum(axis=1).astype(np.int32), crosses @ weight


class StateSums:
    """Per state: weights, and fwd + bwd and activations at each per-device batch (sums over its downset)."""

    def __init__(self, dag: AntichainDag, model: CostModel, units: StageUnits) -> None:
        self.model = model
        self.units = units
        words = state_words(dag)
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, : dag.num_units]
        self.member = bits.astype(np.float64)
        self.params = self.member @ np.array([sum(model.param_bytes[op] for op in ops) for ops in units.ops],
                                             dtype=np.float64)
        self._at: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    def at(self, per_device: float) -> tuple[np.ndarray, np.ndarray]:
        """(fwd + bwd, activations) per state on `per_device` samples, cached."""
        hit = self._at.get(per_device)
        if hit is None:
            compute = np.zeros(len(self.units.ops))
            act = np.zeros(len(self.units.ops))
            for idx, ops in enumerate(self.units.ops):
                for op in ops:
                    fwd, bwd, acts = self.model.op_at(op, per_device)
                    compute[idx] += fwd + bwd
                    act[idx] += acts
            hit = self._at[per_device] = (self.member @ compute, self.member @ act)
        return hit


def stage_costs(sums: StateSums, pairs: StagePairs, size: int, degree: int, memory_limit: float,
                max_stages: int) -> StageCosts:
    """Every pair's stage with micro-batch `size` on `degree` devices, costed as `CostModel.stage_cost`."""
    model = sums.model
    per_device = size / degree
    compute, act = sums.at(per_device)
    params = sums.params[pairs.uppers] - sums.params[pairs.lowers]
    comm = p2p_ms_array(model.link, pairs.messages, pairs.bytes_per_sample * per_device)
    tps = time_per_sample_ms_array(model.device, compute[pairs.uppers] - compute[pairs.lowers], comm,
                                   model.per_iteration_array(params, degree), size)
    acts = np.round(act[pairs.uppers] - act[pairs.lowers])
    cap = max_in_flight_micro_batches_array(params, acts, memory_limit, model.global_batch_size // size, max_stages)
    return StageCosts(tps_ms=tps, in_flight_cap=cap.astype(np.int16))
