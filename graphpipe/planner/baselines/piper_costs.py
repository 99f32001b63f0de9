"""Stage costs for Piper's DP, for one upper downset J and all its sub-downsets I at once.

A stage is J \\ I. Compute, activations and weights are sums over its units, so each is a per-downset
total and a stage costs total(J) - total(I), read for every I in one numpy operation. The tensors
crossing the stage's boundary are not additive; they come from the bitsets: with I ⊂ J both
downsets, a stage receives tensor t (made in unit u_t) when u_t is in I and a reader of t lies in
J \\ I, and sends it when u_t is in J \\ I and a reader lies outside J (`Boundary`). The TPS is
the rule's twin (`graphpipe.cost.formulas.time_per_sample`), as `CostModel.stage_cost` prices it, so a
stage costs what the plan will cost, up to the rounding of the sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphpipe.cost.formulas.communication import p2p_ms_array
from graphpipe.cost.formulas.memory import max_in_flight_micro_batches_array
from graphpipe.cost.formulas.time_per_sample import time_per_sample_ms_array
from graphpipe.planner.baselines.downsets import WORD, Downsets, num_words
from graphpipe.planner.request import PlanRequest


@dataclass(frozen=True)
class Boundary:
    """The tensors that may cross a stage boundary: each made by an op in `unit[t]` and read in another unit."""

    unit: np.ndarray  # (tensors,) int: the unit making tensor t
    recv_readers: np.ndarray  # (tensors, words) bitsets: units reading t (along the readers' predecessors)
    send_readers: np.ndarray  # (tensors, words) bitsets: units reading t (along the maker's successors)
    bytes_per_sample: np.ndarray  # (tensors,)


def boundary(request: PlanRequest) -> Boundary:
    model, units = request.model, request.units
    unit_of = {op: idx for idx, ops in enumerate(units.ops) for op in ops}
    recv: dict[str, set[int]] = {}
    send: dict[str, set[int]] = {}
    for op, idx in unit_of.items():
        for pred in model.preds[op]:
            if unit_of[pred] != idx:
                recv.setdefault(pred, set()).add(idx)
        for succ in model.succs[op]:
            if unit_of[succ] != idx:
                send.setdefault(op, set()).add(unit_of[succ])
    tensors = sorted(set(recv) | set(send), key=request.graph.index)
    return Boundary(unit=np.array([unit_of[op] for op in tensors], dtype=np.int64),
                    recv_readers=bitsets([recv.get(op, set()) for op in tensors], len(units.ops)),
                    send_readers=bitsets([send.get(op, set()) for op in tensors], len(units.ops)),
                    bytes_per_sample=np.array([model.out_bytes_per_sample[op] for op in tensors]))


def bitsets(rows: list[set[int]], num_units: int) -> np.ndarray:
    words = np.zeros((len(rows), num_words(num_units)), dtype=np.uint64)
    for row, members in enumerate(rows):
        for idx in members:
            words[row, idx // WORD] |= np.uint64(1 << idx % WORD)
    return words


@dataclass(frozen=True)
class PairTraffic:
    """Stages J \\ I for aligned ids: the messages and bytes per sample crossing each one's boundary."""

    uppers: np.ndarray  # (pairs,) ids of J
    lowers: np.ndarray  # (pairs,) ids of I
    messages: np.ndarray  # (pairs,) float
    bytes_per_sample: np.ndarray  # (pairs,)

    def part(self, start: int, stop: int) -> PairTraffic:
        """The pairs start..stop-1."""
        return PairTraffic(self.uppers[start:stop], self.lowers[start:stop], self.messages[start:stop],
                           self.bytes_per_sample[start:stop])


def concat_traffic(parts: list[PairTraffic]) -> PairTraffic:
    return PairTraffic(*(np.concatenate([getattr(part, name) for part in parts]) if parts else np.zeros(0)
                         for name in ("uppers", "lowers", "messages", "bytes_per_sample")))


def traffic(downsets: Downsets, edges: Boundary, uppers: np.ndarray, lowers: np.ndarray) -> PairTraffic:
    """The traffic of the stages uppers[i] \\ lowers[i]. Each row's sums run in the same order whatever the
    other rows, so a stage costs the same bits in the DP and when its plan is traced back."""
    upper, lower = downsets.words[uppers][:, None, :], downsets.words[lowers][:, None, :]
    made_in_lower = downsets.members[lowers[:, None], edges.unit[None, :]]
    made_in_stage = downsets.members[uppers[:, None], edges.unit[None, :]] & ~made_in_lower
    received = made_in_lower & np.any(upper & ~lower & edges.recv_readers, axis=2)
    sent = made_in_stage & np.any(~upper & edges.send_readers, axis=2)
    crossing = received | sent  # disjoint: made inside I or inside the stage
    return PairTraffic(uppers=uppers, lowers=lowers, messages=crossing.sum(axis=1).astype(float),
                       bytes_per_sample=np.where(crossing, edges.bytes_per_sample, 0.0).sum(axis=1))


def below(downsets: Downsets, edges: Boundary, upper: int) -> PairTraffic:
    """Every stage upper \\ I, I a sub-downset of `upper`."""
    lowers = downsets.subsets_of(upper)
    return traffic(downsets, edges, np.full(len(lowers), upper), lowers)


def above(downsets: Downsets, edges: Boundary, lower: int) -> PairTraffic:
    """Every stage J \\ lower, J a super-downset of `lower`."""
    uppers = downsets.supersets_of(lower)
    return traffic(downsets, edges, uppers, np.full(len(uppers), lower))


class StageTables:
    """Per-downset totals of compute, activations and weights at one micro-batch size, per degree."""

    def __init__(self, request: PlanRequest, downsets: Downsets, micro_batch_size: int,
                 degrees: tuple[int, ...]) -> None:
        model = request.model
        self.request = request
        self.size = micro_batch_size
        self.num_micro_batches = request.global_batch_size // micro_batch_size
        members = downsets.members.astype(float)
        params = np.array([sum(model.param_bytes[op] for op in ops) for ops in request.units.ops], dtype=float)
        self.params = members @ params
        self.compute: dict[int, np.ndarray] = {}
        self.act: dict[int, np.ndarray] = {}
        for degree in degrees:
            per_device = micro_batch_size / degree
            costs = [[model.op_at(op, per_device) for op in ops] for ops in request.units.ops]
            self.compute[degree] = members @ np.array([sum(f + b for f, b, _ in unit) for unit in costs])
            self.act[degree] = members @ np.array([sum(a for _, _, a in unit) for unit in costs])

    def stage(self, pairs: PairTraffic, degree: int, max_in_flight: int) -> tuple[np.ndarray, np.ndarray]:
        """(TPS in ms, most micro-batches in flight, capped at `max_in_flight`) of each stage J \\ I of
        `pairs` on `degree` devices."""
        request, model = self.request, self.request.model
        uppers, lowers = pairs.uppers, pairs.lowers
        per_device = self.size / degree
        compute = self.compute[degree][uppers] - self.compute[degree][lowers]
        params = self.params[uppers] - self.params[lowers]
        act = np.round(self.act[degree][uppers] - self.act[degree][lowers])
        comm = p2p_ms_array(model.link, pairs.messages, pairs.bytes_per_sample * per_device)
        tps = time_per_sample_ms_array(model.device, compute, comm, model.per_iteration_array(params, degree),
                                       self.size)
        k_max = max_in_flight_micro_batches_array(params, act, request.memory_limit, self.num_micro_batches,
                                                  max_in_flight)
        return tps, k_max
