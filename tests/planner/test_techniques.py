"""Recomputation and the zero-bubble schedule as choices of every planner (`graphpipe.planner.techniques`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphpipe.cost.formulas.memory import static_memory_bytes
from graphpipe.errors import PlanningError
from graphpipe.planner.api import make_request
from graphpipe.planner.baselines.exhaustive import plan_exhaustive
from graphpipe.planner.build import build_plan
from graphpipe.planner.options import PlanOptions, parse_techniques
from graphpipe.planner.techniques import recomputed_to_fit, recomputing_costs, zero_bubble_twin
from graphpipe.planning import plan
from graphpipe.simulation.simulator import iteration_lower_bound_s, simulate
from graphpipe.stages.recompute import reprice_recompute
from graphpipe.stages.stage_graph import Plan
from graphpipe.stages.validate import validate_plan
from tests.planner.random_sp_graphs import Case, cases
from tests.planner.reference_dp import ReferenceDP
from tests.planner.test_reference_dp import SEARCH_TOLERANCE, SMALL_SHAPES, report

GiB = 2**30
EXACT = 1e-9
ORACLE_UNITS = 7  # every convex partition of the units is enumerated


def test_techniques_are_named_and_checked() -> None:
    assert parse_techniques("none") == () and parse_techniques("") == ()
    assert parse_techniques("all") == ("recompute", "zero-bubble")
    assert parse_techniques("zero-bubble, recompute") == ("recompute", "zero-bubble")
    assert PlanOptions(techniques="recompute").techniques == ("recompute",)
    with pytest.raises(PlanningError, match=r"unknown technique.*choose from none, all, recompute, zero-bubble"):
        PlanOptions(techniques=("recompute", "offload"))


def test_recomputing_costs_add_a_forward_to_each_backward_and_divide_the_activations() -> None:
    from tests.planner.factories import chain_graph, make_costs

    costs = make_costs(chain_graph(3), act_bytes=1000)
    again = recomputing_costs(costs, 4)
    for op in costs.op_names:
        kept, priced = costs.at(op, 2), again.at(op, 2)
        assert priced.bwd_ms == pytest.approx(kept.bwd_ms + kept.fwd_ms)
        assert (priced.fwd_ms, priced.act_bytes, priced.param_bytes) == (kept.fwd_ms, kept.act_bytes // 4,
                                                                         kept.param_bytes)


def _mmt(num_devices: int) -> tuple[Any, Any, Any]:
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.cost.presets import cluster_preset
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model

    zoo = load_model("mmt", "paper", device="meta")
    graph = capture(zoo.model, zoo.inputs)
    return graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", num_devices)


def test_mmt_recomputes_where_memory_binds_and_gains_the_split_backward() -> None:
    """mmt (the paper's) on 8 V100s, mini-batch 128, under 1.0 GiB a device: every plan keeping its activations
    takes micro-batch 1; recomputing stages take micro-batch 2, and the split backward adds to that. At 0.9 GiB
    no plan fits without recomputation."""
    graph, costs, cluster = _mmt(8)
    limit = 1.0 * GiB
    plain = plan(graph, costs, cluster, 128, memory_limit=limit)
    chosen = plan(graph, costs, cluster, 128, memory_limit=limit, techniques="recompute")
    both = plan(graph, costs, cluster, 128, memory_limit=limit, techniques="all")
    assert plain.recompute_stages == () and plain.stages[0].micro_batch_size == 1
    assert chosen.recompute_stages and chosen.predicted_iteration_s < plain.predicted_iteration_s
    assert {stage.micro_batch_size for stage in chosen.stages} == {2}
    assert both.schedule == "zero-bubble" and both.predicted_iteration_s <= chosen.predicted_iteration_s
    for found in (chosen, both):
        validate_plan(found, graph, cluster, memory_limit=limit)
        result = simulate(found, costs, cluster, schedule=found.schedule)
        assert found.predicted_iteration_s == pytest.approx(result.iteration_time_s, rel=EXACT)
        assert max(result.peak_memory_bytes) <= limit
    with pytest.raises(PlanningError, match="no plan fits"):
        plan(graph, costs, cluster, 128, memory_limit=0.9 * GiB)
    tight = plan(graph, costs, cluster, 128, memory_limit=0.9 * GiB, techniques="recompute")
    assert tight.recompute_stages
    validate_plan(tight, graph, cluster, memory_limit=0.9 * GiB)


def test_recomputation_goes_exactly_on_the_stages_above_the_limit() -> None:
    graph, costs, cluster = _mmt(8)
    roomy = plan(graph, costs, cluster, 128, memory_limit=2 * GiB, rank_by="tps")
    limit = sorted(stage.memory_bytes for stage in roomy.stages)[-2] - 1  # the two largest stages exceed it
    fitted = recomputed_to_fit(roomy, costs, limit)
    assert fitted is not None
    over = {stage.idx for stage in roomy.stages if stage.memory_bytes > limit}
    assert set(fitted.recompute_stages) == over and len(over) >= 2
    assert all(stage.memory_bytes <= limit for stage in fitted.stages)
    assert recomputed_to_fit(roomy, costs, 1) is None  # the weights alone exceed it


def test_zero_bubble_twin_only_of_1f1b_plans_with_a_stage_that_splits() -> None:
    graph, costs, cluster = _mmt(8)
    found = plan(graph, costs, cluster, 128, rank_by="tps")
    twin = zero_bubble_twin(found)
    assert twin is not None and twin.schedule == "zero-bubble" and twin.stages == found.stages
    assert zero_bubble_twin(found.with_recompute("all")) is None
    assert zero_bubble_twin(twin) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(), held=st.sampled_from((1, 4, 8)), room=st.sampled_from((1.5, 2.5, 4.0)))
def test_the_choices_never_simulate_slower_and_every_plan_fits(case: Case, held: int, room: float) -> None:
    """Under a limit that binds, with every choice, graphpipe and the sequential planner simulate no slower than
    without; what they return fits the limit, predicted and simulated on its own schedule, and its iteration is that
    schedule's; a zero-bubble plan's lower bound is below its simulated iteration (the ranking's pruning stays
    safe)."""
    case = dataclasses.replace(case, global_batch_size=case.micro_batch_size * held)
    limit = _room_for(case, room)
    for planner in ("graphpipe", "sequential"):
        options: dict[str, Any] = {"planner": planner, "micro_batch_sizes": (case.micro_batch_size,),
                                   "memory_limit": limit}
        without = _plan_or_none(case, options)
        chosen = _plan_or_none(case, {**options, "techniques": "all"})
        if without is not None:
            assert chosen is not None and chosen.predicted_iteration_s <= without.predicted_iteration_s * (1 + EXACT)
        if chosen is None:
            continue
        validate_plan(chosen, case.graph, case.cluster, memory_limit=limit)
        result = simulate(chosen, case.costs, case.cluster, schedule=chosen.schedule)
        assert chosen.predicted_iteration_s == pytest.approx(result.iteration_time_s, rel=EXACT)
        assert max(result.peak_memory_bytes) <= limit, case.describe()
        twin = zero_bubble_twin(chosen)
        if twin is not None:
            bound = iteration_lower_bound_s(twin, case.costs, case.cluster)
            simulated = simulate(twin, case.costs, case.cluster, schedule="zero-bubble").iteration_time_s
            assert bound <= simulated * (1 + EXACT)


def _plan_or_none(case: Case, options: dict[str, Any]) -> Plan | None:
    try:
        return plan(case.graph, case.costs, case.cluster, case.global_batch_size, **options)
    except PlanningError:
        return None


def test_the_exhaustive_oracle_chooses_per_stage_and_bounds_the_planner() -> None:
    """The exhaustive search with the recompute choice is the exact optimum of the per-stage choice over every convex
    partition: never above it without the choice, recomputing only stages that do not fit otherwise, and a lower
    bound on graphpipe's best TPS with the choice (graphpipe's graphs are among its partitions, and its chains hold
    at least as many micro-batches as the same partition's stage graph). The tally says how far graphpipe's search
    (plans found on recomputing costs, then recomputed where they exceed the limit) is from it."""
    tally: Counter[str] = Counter()

    @settings(max_examples=60, deadline=None, derandomize=True,  # the same cases every run: the tally is reported
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(case=cases(shapes=SMALL_SHAPES, max_units=ORACLE_UNITS), held=st.sampled_from((4, 8)),
           room=st.sampled_from((1.5, 2.5, 4.0)))
    def check(case: Case, held: int, room: float) -> None:
        case = dataclasses.replace(case, global_batch_size=case.micro_batch_size * held)  # micro-batches in flight
        limit = _room_for(case, room)
        fields: dict[str, Any] = {"micro_batch_sizes": (case.micro_batch_size,), "memory_limit": limit}
        oracle = _oracle_tps(case, fields, "recompute")
        plain = _oracle_tps(case, fields, "none")
        assert oracle <= plain * (1 + EXACT)
        if oracle == float("inf"):
            return
        tally["cases"] += 1
        tally["the choice lowers the optimum"] += oracle < plain * (1 - EXACT)
        found = _best_tps(case, fields, "recompute")
        if found is None:
            tally["graphpipe finds no plan"] += 1
            return
        assert found >= oracle * (1 - 1e-6), case.describe()
        tally["graphpipe within 1% of the optimum"] += found <= oracle * 1.01
        tally["graphpipe at the optimum"] += found <= oracle * (1 + 1e-3)
        without = _best_tps(case, fields, "none")
        tally["graphpipe without the choice at the optimum without it"] += (
            without is not None and without <= plain * (1 + 1e-3))

    check()
    report("graphpipe with recomputation vs the exhaustive per-stage choice", tally)
    assert tally["the choice lowers the optimum"] > 0, tally


def _best_tps(case: Case, fields: dict[str, Any], techniques: str) -> float | None:
    try:
        return plan(case.graph, case.costs, case.cluster, case.global_batch_size, rank_by="tps",
                    techniques=techniques, **fields).predicted_tps_ms
    except PlanningError:
        return None


def _room_for(case: Case, micro_batches: float) -> float:
    """A memory limit with room for the heaviest op's weights and state and `micro_batches` of its activations."""
    model = make_request(case.graph, case.costs, case.cluster, case.global_batch_size).model
    return max(static_memory_bytes(model.param_bytes[op]) for op in case.graph.names) + micro_batches * max(
        model.op_at(op, case.micro_batch_size)[2] for op in case.graph.names)


def _oracle_tps(case: Case, fields: dict[str, Any], techniques: str) -> float:
    request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size, techniques=techniques,
                           **fields)
    best = float("inf")
    for partition in plan_exhaustive(request):
        found = build_plan(request.model, partition, "exhaustive")
        validate_plan(found, case.graph, case.cluster, memory_limit=request.memory_limit)
        wanted = {frozenset(spec.ops): spec.recompute for spec in partition.stages}
        assert all(stage.recompute == wanted[frozenset(stage.ops)] for stage in found.stages)
        kept = reprice_recompute(found, (), case.costs)  # recomputing only where keeping does not fit
        assert all(again.memory_bytes > request.memory_limit for again in kept.stages if again.idx in
                   found.recompute_stages)
        best = min(best, found.predicted_tps_ms)
    return best


def test_the_reference_dp_covers_the_choice_and_bounds_the_planner() -> None:
    """The tests' reference DP with every stage free to recompute (`ReferenceDP(..., recompute=True)`) is the optimum
    of graphpipe's space with the per-stage choice: never above it without the choice, a lower bound on graphpipe's
    best TPS with the choice, and every stage of graphpipe's plan priced as the reference prices its variant. The
    tally says how often graphpipe's search reaches it."""
    tally: Counter[str] = Counter()

    @settings(max_examples=150, deadline=None, derandomize=True,  # the same cases every run: the tally is reported
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(case=cases(shapes=SMALL_SHAPES), held=st.sampled_from((4, 8)), room=st.sampled_from((1.5, 2.5, 4.0)))
    def check(case: Case, held: int, room: float) -> None:
        case = dataclasses.replace(case, global_batch_size=case.micro_batch_size * held)
        limit = _room_for(case, room)
        args = (case.tree, case.graph, case.costs, case.cluster, case.global_batch_size, case.micro_batch_size, limit)
        again, plain = ReferenceDP(*args, recompute=True), ReferenceDP(*args)
        optimum, without = again.optimum(), plain.optimum()
        assert optimum <= without * (1 + EXACT)
        if optimum == float("inf"):
            return
        tally["cases"] += 1
        tally["the choice lowers the optimum"] += optimum < without * (1 - EXACT)
        fields: dict[str, Any] = {"micro_batch_sizes": (case.micro_batch_size,), "memory_limit": limit}
        try:
            found = plan(case.graph, case.costs, case.cluster, case.global_batch_size, rank_by="tps",
                         techniques="recompute", **fields)
        except PlanningError:
            tally["graphpipe finds no plan"] += 1
            return
        assert found.predicted_tps_ms >= optimum * (1 - EXACT), case.describe()
        for stage in found.stages:  # each stage's TPS and memory are the reference's for its variant
            ops, d = frozenset(stage.ops), len(stage.ranks)
            tps, _ = again.model.variants(ops, d, case.cluster.num_devices)[int(stage.recompute)]
            assert stage.tps_ms == pytest.approx(tps, rel=EXACT)
            count = stage.in_flight_samples // case.micro_batch_size
            assert stage.memory_bytes == pytest.approx(again.model.memory(ops, d, count, stage.recompute), abs=2)
        tally["graphpipe within 1% of the optimum"] += found.predicted_tps_ms <= optimum * 1.01
        tally["graphpipe at the optimum"] += found.predicted_tps_ms <= optimum * (1 + SEARCH_TOLERANCE)

    check()
    report("graphpipe with recomputation vs the reference DP with the choice", tally)
    assert tally["the choice lowers the optimum"] > 0, tally
