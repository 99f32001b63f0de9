"""One stage-cost rule: every planner, baseline, DP table and the simulator price a stage as it does.

The rule (`graphpipe.cost.formulas.time_per_sample`), written out here once as its closed form:

    TPS = (fwd + bwd + fwd action + bwd action + p2p) / b + (all_reduce + 7 x weights / memory bandwidth + step) / B

on devices whose per-action and optimizer-step overheads are not zero (a preset's device with them set), under
memory limits that bind, with data-parallel stages and a tied weight:

- every planner's plans record the closed form's TPS per stage, and the simulator runs each stage's forwards,
  backwards and step for the rule's times (`test_every_planner_and_the_simulator_price_a_stage_by_the_rule`);
- the tables the DP and the baselines search (segments, merged groups, runs of many branches, a join's stage,
  merge stages, the band; PipeDream's and Piper's stages) and the reference DP of the tests price every stage
  they offer as `CostModel.stage_cost` does (checked above against the closed form), and their bounds (the band's
  reach, a cut prefix's last stage) stay at or below it.

A copy of the rule that drops or changes a term fails here (docs/architecture.md, "One stage-cost rule").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from graphpipe.cost.cluster import Cluster, Device, Link
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.communication import p2p_ms, ring_all_reduce_ms
from graphpipe.graph.op_graph import OpGraph, ParamRef
from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.baselines.antichains import antichain_dag
from graphpipe.planner.baselines.downsets import find_downsets
from graphpipe.planner.baselines.pipedream_tables import StateSums, stage_costs, stage_pairs
from graphpipe.planner.baselines.piper_costs import StageTables, below, boundary
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import Search, build_tables, divisors_up_to
from graphpipe.planner.sp_dp.band import band_widths, chain_band
from graphpipe.planner.sp_dp.blocks import MERGE_BRANCHES
from graphpipe.planner.sp_dp.merge_tails import MergeTable
from graphpipe.planner.sp_dp.size_tables import SizeTables, fewest_degree
from graphpipe.planner.sp_dp.tables import Block, ChainInfo, ChainTables, ParInfo
from graphpipe.planner.stage_cost import CostModel, all_reduce_link, p2p_link
from graphpipe.simulation.simulator import simulate
from graphpipe.simulation.stage_cost import stage_costs as simulator_stage_costs
from graphpipe.stages.stage_graph import Plan
from tests.planner.factories import GiB, branches_graph, make_costs
from tests.planner.random_sp_graphs import Case, cases
from tests.planner.reference_dp import StageModel

MiB = 2**20
EXACT = 1e-12  # the same terms in another order
TABLES = 1e-9  # the DP's compute is a difference of prefix sums
NO_LIMIT = 1e18
OVERHEADS = {"fwd_action_overhead_us": 400.0, "bwd_action_overhead_us": 900.0, "step_overhead_us": 6000.0,
             "step_bandwidth_gb_per_s": 40.0}  # the optimizer far below the memory's 900 GB/s
PLANNERS = ("graphpipe", "sequential", "parallel-only", "pipedream", "piper", "exhaustive")
TIED_BYTES = 192 * MiB
LIMIT = 2.5 * GiB  # below the peak of the best plans without a limit: they change


def with_overheads(device: Device) -> Device:
    return dataclasses.replace(device, **OVERHEADS)


# A collective slower than the point-to-point link (as gloo's all-reduce over loopback is): a pricer that reads
# the intra-node link for an all-reduce drifts from the rule.
COLLECTIVE = Link(name="slow-collective", latency_us=20.0, bandwidth_gb_per_s=5.0)


def summit(num_devices: int) -> Cluster:
    base = Cluster.preset("summit", num_devices)
    return dataclasses.replace(base, device=with_overheads(base.device), collective=COLLECTIVE)


def tied_graph() -> OpGraph:
    """Two branches of two ops into a join and a head; the head reads the first op's weight (tied, as an LM head
    reads the embedding)."""
    graph = branches_graph(2, 2)
    tied = ParamRef(name="b0_0.weight", num_bytes=TIED_BYTES, shared_with=("head",))
    return dataclasses.replace(graph, ops=tuple(dataclasses.replace(op, params=(tied,)) if op.name == "b0_0" else op
                                                for op in graph.ops))


def tied_costs(graph: OpGraph) -> CostTable:
    fwd = {op: 1.0 + (idx * 7) % 5 for idx, op in enumerate(graph.names)}
    params = {op: TIED_BYTES if op == "b0_0" else 64 * MiB for op in graph.names}
    return make_costs(graph, fwd, overhead_ms=0.5, act_bytes=96 * MiB, param_bytes=params)


# ---- the plans and the simulator ----------------------------------------------------------------


def closed_form_tps(model: CostModel, ops: tuple[str, ...], degree: int, micro_batch_size: int) -> float:
    """The rule's closed form on the planner's view of a stage: links before placement, a tied copy per reader."""
    cluster, costs, device = model.cluster, model.costs, model.cluster.device
    share = micro_batch_size / degree
    fwd = sum(costs.at(op, share).fwd_ms for op in ops) + device.fwd_action_overhead_us / 1e3
    bwd = sum(costs.at(op, share).bwd_ms for op in ops) + device.bwd_action_overhead_us / 1e3
    messages, bytes_per_sample = model.boundary(ops)
    params = sum(model.param_bytes[op] for op in ops)
    comm = p2p_ms(p2p_link(cluster), messages, bytes_per_sample * share)
    reduce_ms = ring_all_reduce_ms(all_reduce_link(cluster, degree), params, degree)
    step_ms = closed_form_step(device, params)
    return (fwd + bwd + comm) / micro_batch_size + (reduce_ms + step_ms) / model.global_batch_size


def closed_form_step(device: Device, param_bytes: float) -> float:
    return 7 * param_bytes / (device.step_bandwidth_gb_per_s * 1e9) * 1e3 + device.step_overhead_us / 1e3


def check_plan(plan: Plan, graph: OpGraph, costs: CostTable, cluster: Cluster) -> None:
    """Each stage's TPS in the plan is the closed form's; the simulator runs its forwards and backwards for the
    closed form's per-micro-batch times (those the plan records) and its step for the closed form's step."""
    model = CostModel(graph, costs, cluster, plan.global_batch_size)
    device = cluster.device
    per_stage = simulator_stage_costs(plan, costs, device)
    timeline = simulate(plan, costs, cluster, plan.schedule).timeline
    for stage in plan.stages:
        degree, size = len(stage.ranks), stage.micro_batch_size
        assert stage.tps_ms == pytest.approx(closed_form_tps(model, stage.ops, degree, size), rel=EXACT), stage
        share = size / degree
        fwd = sum(costs.at(op, share).fwd_ms for op in stage.ops) + device.fwd_action_overhead_us / 1e3
        bwd = sum(costs.at(op, share).bwd_ms for op in stage.ops) + device.bwd_action_overhead_us / 1e3
        assert stage.fwd_ms == pytest.approx(fwd, rel=EXACT) and stage.bwd_ms == pytest.approx(bwd, rel=EXACT)
        simulated = per_stage[stage.idx]
        assert (simulated.fwd_ms, simulated.bwd_ms) == pytest.approx((stage.fwd_ms, stage.bwd_ms), rel=EXACT)
        for kind, expected in (("forward", fwd), ("backward", bwd)):
            durations = [event.duration_ms for event in timeline.of_stage(stage.idx, kind)]
            assert durations == pytest.approx([expected] * plan.num_micro_batches(stage.idx), rel=EXACT), kind
        steps = [event.duration_ms for event in timeline.of_stage(stage.idx, "step")]
        assert steps == pytest.approx([closed_form_step(device, simulated.param_bytes)], rel=EXACT)
        owners_with_readers = {"b0_0", "head"} <= set(stage.ops)  # the planner counts the tied copy twice there
        if not owners_with_readers:
            assert simulated.param_bytes == sum(model.param_bytes[op] for op in stage.ops)


def planners_plans(limit: float | None) -> Iterator[tuple[str, Plan]]:
    graph, cluster = tied_graph(), summit(8)
    costs = tied_costs(graph)
    for planner in PLANNERS:
        for plan in plan_candidates(graph, costs, cluster, 32, planner=planner, memory_limit=limit):
            yield planner, plan
    for plan in plan_candidates(graph, costs, cluster, 32, per_stage_micro_batch=True, memory_limit=limit):
        yield "graphpipe per-stage sizes", plan


@pytest.mark.parametrize("limit", [None, LIMIT])
def test_every_planner_and_the_simulator_price_a_stage_by_the_rule(limit: float | None) -> None:
    graph, cluster = tied_graph(), summit(8)
    costs = tied_costs(graph)
    found = list(planners_plans(limit))
    assert {planner for planner, _ in found} >= set(PLANNERS)
    for planner, plan in found:
        try:
            check_plan(plan, graph, costs, cluster)
        except AssertionError as err:
            raise AssertionError(f"{planner}: {plan}") from err
    assert any(len(stage.ranks) > 1 for _, plan in found for stage in plan.stages)  # data-parallel stages
    assert any(plan.shared_params for _, plan in found)  # the tied weight in two stages
    if limit is not None:  # the limit binds: the best plans without it do not fit under it
        unlimited = [plan for _, plan in planners_plans(None)]
        assert any(stage.memory_bytes > limit for plan in unlimited for stage in plan.stages)


def test_the_planner_charges_the_overheads() -> None:
    """The overheads change the plans' TPS by their closed form (so a rule without them fails the test above)."""
    graph, cluster = tied_graph(), summit(8)
    costs = tied_costs(graph)
    bare = dataclasses.replace(cluster, device=Cluster.preset("summit", 8).device)
    model, loaded = CostModel(graph, costs, bare, 32), CostModel(graph, costs, cluster, 32)
    ops = ("b0_0", "b0_1")
    plain, heavy = model.stage_cost(ops, 2, 8), loaded.stage_cost(ops, 2, 8)
    actions_ms = (OVERHEADS["fwd_action_overhead_us"] + OVERHEADS["bwd_action_overhead_us"]) / 1e3
    slower_stream_ms = closed_form_step(cluster.device, heavy.param_bytes) - OVERHEADS["step_overhead_us"] / 1e3 \
        - 7 * heavy.param_bytes / (bare.device.mem_bandwidth_gb_per_s * 1e9) * 1e3  # Adam at 40, not 900 GB/s
    assert heavy.tps_ms - plain.tps_ms == pytest.approx(
        actions_ms / 8 + (OVERHEADS["step_overhead_us"] / 1e3 + slower_stream_ms) / 32)
    assert heavy.fwd_ms - plain.fwd_ms == pytest.approx(OVERHEADS["fwd_action_overhead_us"] / 1e3)


# ---- the tables the searches read ---------------------------------------------------------------


def loaded_case(case: Case) -> Case:
    return dataclasses.replace(case, cluster=dataclasses.replace(case.cluster, collective=COLLECTIVE,
                                                                 device=with_overheads(case.cluster.device)))


def tables_of(case: Case, limit: float) -> tuple[PlanRequest, ChainTables, list[ParInfo], SizeTables]:
    request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                           micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, request.num_devices, case.micro_batch_size, limit, chains, pars)
    return request, chains, pars, search.tables


def assert_priced(found: float, model: CostModel, ops: tuple[str, ...], degree: int, size: int) -> None:
    expected = model.stage_cost(ops, degree, size).tps_ms
    assert math.isclose(found, expected, rel_tol=TABLES, abs_tol=1e-12), (ops, degree, found, expected)


def check_segments(model: CostModel, tables: SizeTables, info: ChainInfo) -> None:
    """The segment table, its band at a few targets (the same numbers) and the band's reach and a cut prefix's
    last stage (bounds: at or below the TPS)."""
    _, tps, k_max, fits = tables._table(info)
    size = tables.micro_batch_size
    for pos, degree in enumerate(tables.degrees):
        for start in range(info.num_items):
            for stop in range(start + 1, info.num_items + 1):
                assert_priced(float(tps[pos, start, stop]), model, info.ops(start, stop), degree, size)
    later = np.triu(np.ones(tps.shape[1:], dtype=bool), 1)
    for target in np.quantile(tps[:, later], [0.1, 0.5]).tolist():
        widths = band_widths(tables, info, target)
        for pos in range(len(tables.degrees)):
            starts, stops = np.nonzero((tps[pos] <= target) & later)
            assert (stops - starts <= widths[pos]).all(), (target, pos)
        band = chain_band(tables, info, target)
        if band is not None:
            for group in band.groups:
                starts, offsets = np.nonzero(np.arange(group.width)[None, :] < info.num_items
                                             - np.arange(info.num_items + 1)[:, None])
                for row in range(len(group.degrees)):
                    assert (group.tps[row, starts, offsets]
                            == tps[group.first + row, starts, starts + 1 + offsets]).all()
        for stop in range(1, info.num_items + 1):
            for held in (1, tables.max_v):
                loose = tables.loose_last(info, stop, target, held)
                meets = (tps[:, :stop, stop] <= target) & fits[:, :stop, stop] & (k_max[:, :stop, stop] >= held)
                assert (loose <= fewest_degree(meets, tables.degrees, axis=0)).all()


def check_groups(model: CostModel, tables: SizeTables, pinfo: ParInfo) -> None:
    """Merged branches: every group of a block of at most 4 branches, every run of a larger one."""
    count, size = len(pinfo.branch_infos), tables.micro_batch_size
    if count <= 4:
        for mask in range(1, 1 << count):
            if mask.bit_count() >= 2:
                for degree, tps, _ in tables.group_options(pinfo, mask):
                    assert_priced(tps, model, pinfo.group_ops(mask), degree, size)
        return
    tps, _ = tables.run_options(pinfo)
    for start in range(count):
        for stop in range(start + 2, count + 1):
            for pos, degree in enumerate(tables.degrees):
                if math.isfinite(tps[start, stop, pos]):
                    assert_priced(float(tps[start, stop, pos]), model, pinfo.group_ops((1 << stop) - (1 << start)),
                                  degree, size)


def check_block(model: CostModel, tables: SizeTables, block: Block) -> None:
    """A join's stage with the lightest branches (blocks of many) and the merge stages (blocks of two)."""
    assert block.join is not None
    pinfo, join_ops, size = block.pinfo, block.join.ops, tables.micro_batch_size
    for start in pinfo.join_groups():
        ops = pinfo.with_join(start, join_ops)[0]
        for degree, tps, _ in tables.joined_options(pinfo, start, join_ops):
            assert_priced(tps, model, ops, degree, size)
    if block.num_branches != MERGE_BRANCHES:
        return
    table = MergeTable(tables, pinfo, join_ops)
    starts0, starts1 = table.starts
    tps, _ = table._costs(len(starts0), len(starts1))
    for pos, degree in enumerate(tables.degrees):
        for t0, s0 in enumerate(starts0.tolist()):
            for t1, s1 in enumerate(starts1.tolist()):
                assert_priced(float(tps[pos, t0, t1]), model, pinfo.merge_ops(join_ops, s0, s1), degree, size)


def blocks_of(chains: ChainTables) -> Iterator[Block]:
    for info in list(chains):
        for start in range(info.num_items):
            block = info.fork_join(start)
            if block is not None and block.join is not None:
                yield block


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_the_dp_tables_price_every_stage_by_the_rule(case: Case) -> None:
    """On random SP graphs with overheads, with and without a binding limit: every table the SP DP searches, and
    the reference DP of the tests, against `CostModel.stage_cost`."""
    case = loaded_case(case)
    for limit in (NO_LIMIT, case.cluster.device.memory_bytes * 0.05):
        request, chains, pars, tables = tables_of(case, limit)
        model = request.model
        reference = StageModel(case.graph, case.costs, case.cluster, case.global_batch_size, case.micro_batch_size,
                               limit)
        for info in chains:
            if info.num_items:
                check_segments(model, tables, info)
                for degree in tables.degrees:
                    ops = info.ops(0, info.num_items)
                    assert_priced(reference.tps(frozenset(ops), degree), model, ops, degree, case.micro_batch_size)
        for pinfo in pars:
            check_groups(model, tables, pinfo)
        for block in blocks_of(chains):
            check_block(model, tables, block)


def baseline_request(planner: str, size: int, limit: float | None) -> PlanRequest:
    graph = tied_graph()
    return make_request(graph, tied_costs(graph), summit(8), 32, micro_batch_sizes=(size,), planner=planner,
                        memory_limit=limit)


@pytest.mark.parametrize("limit", [None, LIMIT])
@pytest.mark.parametrize("size", [4, 8])
def test_the_baselines_tables_price_every_stage_by_the_rule(size: int, limit: float | None) -> None:
    """PipeDream's pairs of antichain states and Piper's pairs of downsets, every stage on every degree."""
    request = baseline_request("pipedream", size, limit)
    model, units = request.model, request.units
    dag = antichain_dag(units, math.inf, 10**6)
    sums = StateSums(dag, model, units)
    pairs = stage_pairs(dag, model, units, lambda _: None, 10**9)
    for degree in divisors_up_to(size, request.num_devices):
        priced = stage_costs(sums, pairs, size, degree, request.memory_limit, request.num_devices)
        for lower, upper, tps in zip(pairs.lowers.tolist(), pairs.uppers.tolist(), priced.tps_ms.tolist()):
            assert_priced(tps, model, _unit_ops(request, dag.states[upper] & ~dag.states[lower]), degree, size)
    request = baseline_request("piper", size, limit)
    downsets = find_downsets(request.units, max_downsets=10**6, max_explored=10**6, deadline=math.inf,
                             graph_name="tied", granularity="op")
    members, edges = downsets.members, boundary(request)
    degrees = divisors_up_to(size, request.num_devices)
    stage_tables = StageTables(request, downsets, size, degrees)
    for upper in range(len(downsets)):
        pairs_below = below(downsets, edges, upper)
        for degree in degrees:
            tps, _ = stage_tables.stage(pairs_below, degree, request.num_devices)
            for lower, value in zip(pairs_below.lowers.tolist(), tps.tolist()):
                inside = members[upper] & ~members[lower]
                ops = tuple(op for idx in np.flatnonzero(inside).tolist() for op in request.units.ops[idx])
                assert_priced(value, model, ops, degree, size)


def _unit_ops(request: PlanRequest, units: int) -> tuple[str, ...]:
    return tuple(op for idx in range(units.bit_length()) if units >> idx & 1 for op in request.units.ops[idx])

