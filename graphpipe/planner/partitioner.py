"""The GraphPipe partitioner (PAPER.md §4): binary search on a TPS target over a DP on the SP tree.

For one micro-batch size b, a probe with target T asks: is there a stage graph with every
stage's TPS <= T that fits in memory on the devices, and which one has the fewest
in-flight samples at its source? The DP answers per SP node with a *need vector*:

    need[v] = fewest devices with which the node can be staged so that its entry stages
              hold at most v micro-batches in flight (v = in-flight samples / b)

given the in-flight count `k_after` of what follows the node. Vectors are non-increasing
in v; combining two parts is adding their vectors, so device splits d = d1 + d2 cost O(v).

- Chain (series case), solved from the sink backwards, so downstream in-flight counts
  are known when an upstream stage's memory is checked. A suffix starting at item i either
  starts with a segment [i, j) of items as one stage on d1 devices (d1 divides b: every
  device gets whole samples), whose in-flight count is one more than what follows, or,
  when item i is a parallel block, opens it: the block is solved given the in-flight count
  of the rest of the chain. Any op boundary of a chain can be cut, in O(L^2) per chain of
  L items (segment costs are prefix sums; the scan over j stops as soon as the segment's
  compute alone exceeds T or its weights alone exceed memory).
- Parallel block: its branches are grouped; a group is one branch solved as a chain, or
  several whole branches merged into one stage. The fork's stage takes the larger of the
  branches' in-flight requirements (the max over entries). With up to 4 branches every
  grouping is tried; with more, the branches are sorted by compute and groups are runs of
  consecutive branches (interval partitions), which keeps the DP polynomial.

- Fork and join absorption (`graphpipe.planner.fork_join`): the leaves just before a block
  with at most 4 branches may join the first stage of one branch, and the leaves just after
  it the last stage of one branch, so a cheap input or concat + head costs no device.

The stage graphs this DP can produce are those whose stages are runs of items of one SP
chain (or of an extended chain of fork/join absorption) or unions of whole branches of one
parallel block ("SP-aligned" partitions); the exhaustive baseline checks optimality over
exactly that space (`sp_aligned=True`). The binary search stops when the interval is below
1e-3 relative, from the bound of `Search.lower_bound_ms` and a first probe at a hint (the
previous size's optimum) or with no TPS target at all. Uniform micro-batch size and 1F1B
(in-flight = v · b); per-stage sizes are a refinement (`graphpipe.planner.per_stage`).
Sizes and pruning across sizes: see `partition_sp`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from graphpipe.graph.sp import SPChain, SPParallel
from graphpipe.planner.chain_info import ChainInfo
from graphpipe.planner.memory import OPTIMIZER_STATE_FACTOR, max_in_flight_micro_batches
from graphpipe.planner.probe import BIG, MAX_ENUMERATED_BRANCHES, ParInfo, Probe, divisors_up_to
from graphpipe.planner.stage_cost import CostModel, all_reduce_link, p2p_ms
from graphpipe.planner.stage_spec import StageSpec

__all__ = ["MAX_ENUMERATED_BRANCHES", "TOLERANCE", "Search", "divisors_up_to", "partition_sp"]

TOLERANCE = 1e-3
COARSE_TOLERANCE = 5e-2
COARSE_KEEP = 1.05


class Search:
    """Binary search on the TPS target for one micro-batch size (tables shared across probes)."""

    def __init__(self, model: CostModel, tree: SPChain, num_devices: int, micro_batch_size: int,
                 memory_limit: float, infos: dict[int, ChainInfo], pars: dict[int, ParInfo]) -> None:
        self.model = model
        self.tree = tree
        self.num_devices = num_devices
        self.micro_batch_size = micro_batch_size
        self.memory_limit = memory_limit
        self.global_batch_size = model.global_batch_size
        self.num_micro_batches = model.global_batch_size // micro_batch_size  # no stage holds more
        self.degrees = divisors_up_to(micro_batch_size, num_devices)
        self.max_v = num_devices + 1
        self.infos = infos
        self.pars = pars
        self._segments: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._rows: dict[tuple[int, int, int], tuple[list[float], list[float], list[int]]] = {}
        self._tables: dict[tuple[int, int], tuple[tuple[int, list[float], list[float], list[int]], ...]] = {}
        self._groups: dict[tuple[int, int], list[tuple[int, float, int]]] = {}
        self.best: list[StageSpec] = []
        self.lo = self.hi = 0.0

    def segment_rows(self, info: ChainInfo, start: int, d1: int,
                     target_ms: float) -> tuple[list[float], list[float], list[int]]:
        """(compute per sample, TPS, most micro-batches in flight) of segments [start, start + 1 + idx) on d1
        devices, by growing idx, while the weights and one micro-batch fit (so at least as far as the compute
        stays within `target_ms`). Compute never decreases along a row, so the segments within a target are
        the prefix `bisect_right(compute, target)`. The arrays are computed once per chain and degree
        (vectorised over all segments); rows are cut into plain lists once (the DP's inner loop reads
        Python floats)."""
        key = (id(info), d1, start)
        row = self._rows.get(key)
        if row is None:
            compute, tps, k_max = (array[start, start + 1:] for array in self._table(info, d1))
            bad = np.nonzero(k_max < 1)[0]
            fits = int(bad[0]) if len(bad) else len(compute)
            row = self._rows[key] = (compute[:fits].tolist(), tps[:fits].tolist(), k_max[:fits].tolist())
        return row

    def segment_table(self, info: ChainInfo, start: int) -> tuple[tuple[int, list[float], list[float], list[int]], ...]:
        """`segment_rows` of every degree, as (d1, compute, TPS, most in flight), for segments from `start`."""
        key = (id(info), start)
        hit = self._tables.get(key)
        if hit is None:
            hit = self._tables[key] = tuple((d1, *self.segment_rows(info, start, d1, math.inf)) for d1 in self.degrees)
        return hit

    def _table(self, info: ChainInfo, d1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        table = self._segments.get((id(info), d1))
        if table is None:
            table = self._segments[(id(info), d1)] = self._segment_arrays(info, d1)
        return table

    def _segment_arrays(self, info: ChainInfo, d1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        b, model = self.micro_batch_size, self.model
        times, acts = info.prefix_arrays(b / d1)
        messages, num_bytes = info.boundary_matrix()
        params = info.param_array[None, :] - info.param_array[:, None]
        act = acts[None, :] - acts[:, None]
        compute = (times[None, :] - times[:, None]) / b
        link = model.link
        comm = np.where(messages > 0, 2 * (messages * link.latency_us / 1e3
                                           + num_bytes * (b / d1) / (link.bandwidth_gb_per_s * 1e9) * 1e3), 0.0)
        tps = compute + comm / b + self._all_reduce(params, d1) / self.global_batch_size
        spare = self.memory_limit - OPTIMIZER_STATE_FACTOR * params
        with np.errstate(divide="ignore", invalid="ignore"):
            k_max = np.where(act > 0, np.floor(spare / np.where(act > 0, act, 1.0)), float(BIG))
        k_max = np.where(k_max >= self.num_micro_batches, float(BIG), k_max)  # holds the whole mini-batch
        k_max = np.where(spare < 0, -1.0, np.minimum(k_max, float(self.max_v))).astype(np.int64)
        return compute, tps, k_max

    def _all_reduce(self, params: np.ndarray, d1: int) -> np.ndarray | float:
        if d1 <= 1:
            return 0.0
        link = all_reduce_link(self.model.cluster, d1)
        steps = 2 * (d1 - 1)
        return np.where(params > 0, steps / d1 * params / (link.bandwidth_gb_per_s * 1e9) * 1e3
                        + steps * link.latency_us / 1e3, 0.0)

    def group_options(self, pinfo: ParInfo, group: int) -> list[tuple[int, float, int]]:
        """(devices, TPS, most micro-batches in flight) of merged branches, fewest devices first; cached."""
        key = (id(pinfo), group)
        hit = self._groups.get(key)
        if hit is not None:
            return hit
        b, model = self.micro_batch_size, self.model
        ops, params, messages, num_bytes = pinfo.group(group)
        out = []
        if OPTIMIZER_STATE_FACTOR * params <= self.memory_limit:
            for d1 in self.degrees:
                compute = act = 0.0
                for op in ops:
                    fwd, bwd, act_bytes = model.op_at(op, b / d1)
                    compute += fwd + bwd
                    act += act_bytes
                tps = (compute + p2p_ms(model.link, messages, num_bytes * b / d1)) / b
                tps += model.all_reduce_ms(params, d1) / self.global_batch_size
                out.append((d1, tps, max_in_flight_micro_batches(params, act, self.memory_limit,
                                                                    self.num_micro_batches)))
        self._groups[key] = out
        return out

    def probe(self, target_ms: float) -> list[StageSpec] | None:
        probe = Probe(self, target_ms)
        v = probe.best_entry(self.tree)
        return None if v is None else probe.stages(self.tree, v)

    def bottleneck_ms(self, stages: Sequence[StageSpec]) -> float:
        return max(self.model.stage_cost(st.ops, st.num_devices, st.micro_batch_size).tps_ms for st in stages)

    def lower_bound_ms(self) -> float:
        """No plan beats this: every op's compute on its cheapest data-parallel degree, spread over all devices."""
        b, total = self.micro_batch_size, 0.0
        for op in self.tree.ops:
            total += min(sum(self.model.op_at(op, b / d)[:2]) * d for d in self.degrees)
        return total / b / self.num_devices

    def start(self, hint_ms: float | None = None) -> bool:
        """First probe: at `hint_ms` (e.g. another size's optimum) if that is feasible, else unbounded."""
        found = self.probe(hint_ms) if hint_ms is not None else None
        if found is None:
            found = self.probe(math.inf)
        if found is None:
            return False
        self.best, self.hi = found, self.bottleneck_ms(found)
        self.lo = self.lower_bound_ms() * (1 - TOLERANCE)
        return True

    def narrow(self, tolerance: float) -> None:
        """Bisect the target until the interval is below `tolerance` relative."""
        while self.hi - self.lo > tolerance * self.hi:
            mid = (self.lo + self.hi) / 2
            found = self.probe(mid)
            if found is None:
                self.lo = mid
            else:
                self.best, self.hi = found, min(mid, self.bottleneck_ms(found))

    def run(self, tolerance: float = TOLERANCE, hint_ms: float | None = None) -> list[StageSpec] | None:
        if not self.start(hint_ms):
            return None
        self.narrow(tolerance)
        return self.best


def build_tables(model: CostModel, tree: SPChain) -> tuple[dict[int, ChainInfo], dict[int, ParInfo]]:
    """Chain and parallel-block tables, shared by every micro-batch size and probe."""
    from graphpipe.graph.sp import iter_chains

    infos = {id(chain): ChainInfo(model, chain) for chain in iter_chains(tree)}
    pars = {id(item): ParInfo(model, item, infos) for chain in iter_chains(tree) for item in chain.items
            if isinstance(item, SPParallel)}
    return infos, pars


def partition_sp(model: CostModel, tree: SPChain, num_devices: int, micro_batch_sizes: Sequence[int],
                 memory_limit: float, tolerance: float = TOLERANCE,
                 ceiling_ms: float | None = None) -> dict[int, list[StageSpec]]:
    """Best SP-aligned stage graph per micro-batch size (sizes with no feasible plan are left out).

    Sizes are searched from the largest down. A size whose lower bound (`Search.lower_bound_ms`)
    is already more than COARSE_KEEP above the best bottleneck found is skipped: no plan at
    that size could be among the best. Every other size is searched to COARSE_TOLERANCE; then,
    best first, each size whose proven lower bound is below the best bottleneck found so far is
    narrowed to `tolerance` (the others cannot hold the optimum, and their plans are still
    within COARSE_TOLERANCE of their own).
    With `ceiling_ms`, only plans whose bottleneck is at most the ceiling are searched for (one
    probe per size when there are none, none when the size's lower bound is above the ceiling).
    """
    infos, pars = build_tables(model, tree)
    searches: dict[int, Search] = {}
    hint = None
    for size in sorted(micro_batch_sizes, reverse=True):
        search = Search(model, tree, num_devices, size, memory_limit, infos, pars)
        if hint is not None and search.lower_bound_ms() > min(s.hi for s in searches.values()) * COARSE_KEEP:
            continue  # even a perfect plan at this size could not be among the best
        if ceiling_ms is not None:
            if search.lower_bound_ms() * (1 - TOLERANCE) > ceiling_ms:
                continue  # no plan at this size has a bottleneck within the ceiling: skip the probe
            found = search.probe(ceiling_ms)
            if found is None:
                continue  # nothing at this size beats the ceiling
            search.best, search.hi = found, search.bottleneck_ms(found)
            search.lo = search.lower_bound_ms() * (1 - TOLERANCE)
            search.narrow(max(tolerance, COARSE_TOLERANCE))
            searches[size] = search
        elif search.start(hint):
            search.narrow(max(tolerance, COARSE_TOLERANCE))
            searches[size] = search
            hint = search.hi * 1.25
    if not searches:
        return {}
    best = math.inf
    for search in sorted(searches.values(), key=lambda item: item.hi):
        if search.lo < best:  # this size might still hold the optimum
            search.narrow(tolerance)
            best = min(best, search.hi)
    return {size: searches[size].best for size in sorted(searches)}
