"""The simulator prices activation recomputation (`Stage.recompute`) by the rule: a recomputing stage's backward
costs one more forward of its ops (no second action overhead), and its activations are its inputs per
micro-batch in flight plus one micro-batch's full activations (`graphpipe.cost.formulas`). `recompute_plan` moves a
plan's predictions by the same terms, so the plan, the simulator and the closed form of the stage-cost rule agree."""

from __future__ import annotations

import dataclasses

import pytest

from graphpipe.cost.formulas.memory import (
    max_in_flight_micro_batches,
    max_in_flight_micro_batches_recompute,
    recompute_activation_bytes,
    static_memory_bytes,
)
from graphpipe.cost.formulas.time_per_sample import recompute_compute_ms, recompute_extra_ms
from graphpipe.planner.api import plan_candidates
from graphpipe.planner.stage_cost import CostModel
from graphpipe.simulation.reprice import recompute_plan
from graphpipe.simulation.result import SimResult
from graphpipe.simulation.simulator import simulate
from graphpipe.simulation.stage_cost import stage_costs
from graphpipe.stages.memory import stage_memory_bytes
from graphpipe.stages.recompute import recompute_input_bytes
from tests.planner.test_one_cost_rule import closed_form_tps, summit, tied_costs, tied_graph
from tests.simulation.factories import chain, diamond, make_costs, make_plan

F_MS, B_MS = 1.5, 2.5  # per sample
EXACT = 1e-12


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("num_stages", "num_micro_batches"), [(2, 3), (4, 8)])
def test_a_uniform_chain_recomputing_everywhere_takes_one_forward_more_per_micro_batch(kind: str, num_stages: int,
                                                                                       num_micro_batches: int) -> None:
    """Makespan (m + p - 1)(f + b + f): every backward runs the forward again."""
    plan = chain(num_stages, 2, 2 * num_micro_batches)
    costs = make_costs(plan, F_MS, B_MS)
    keep = simulate(plan, costs, schedule=kind)
    again = simulate(plan.with_recompute("all"), costs, schedule=kind)
    f, b = 2 * F_MS, 2 * B_MS
    assert keep.iteration_time_s * 1e3 == pytest.approx((num_micro_batches + num_stages - 1) * (f + b))
    assert again.iteration_time_s * 1e3 == pytest.approx((num_micro_batches + num_stages - 1) * (f + b + f))
    assert again.recompute_stages == tuple(range(num_stages)) and keep.recompute_stages == ()


def test_memory_falls_to_the_inputs_per_micro_batch_in_flight_plus_one_micro_batch() -> None:
    """A chain of 3, micro-batches of 2 samples, 1000 activation bytes and 100 edge bytes per sample: under 1F1B
    the stages hold 3, 2, 1 micro-batches; recomputing, stage 0 (no stage inputs, no model input named) holds one
    micro-batch's activations, stage 1 two micro-batches' inputs and one's activations, the last one's inputs
    and activations (one input more than keeping everything)."""
    plan = chain(3, 2, 8, bytes_per_sample=100.0)
    costs = make_costs(plan, act_bytes=1000, param_bytes=10**6)
    keep = simulate(plan, costs)
    again = simulate(plan.with_recompute("all"), costs)
    static = 4 * 10**6
    assert keep.peak_memory_bytes == (static + 3 * 2000, static + 2 * 2000, static + 2000)
    assert again.peak_memory_bytes == (static + 2000, static + 2 * 200 + 2000, static + 200 + 2000)
    assert again.peak_in_flight_samples == keep.peak_in_flight_samples  # the schedule is the same
    assert again.static_memory_bytes == keep.static_memory_bytes
    for idx, rank in enumerate(range(3)):
        held = keep.peak_in_flight_samples[idx] // 2
        input_bytes = 200 if idx else 0
        assert again.peak_memory_bytes[rank] == static + recompute_activation_bytes(input_bytes, 2000, held)


def test_only_the_chosen_stages_change_and_time_rises_by_their_forwards() -> None:
    """Recomputing s1 of a diamond: its backward events last b + f, the others' are untouched; its memory falls."""
    plan = diamond(2, 16, bytes_per_sample=10.0)
    costs = make_costs(plan, [1.0, 3.0, 1.0, 1.0], 2.0, act_bytes=1000)
    keep, again = simulate(plan, costs), simulate(plan.with_recompute("s1"), costs)
    for idx in range(4):
        want = 2 * 2.0 + (2 * 3.0 if idx == 1 else 0.0)
        durations = [event.duration_ms for event in again.timeline.of_stage(idx, "backward")]
        assert durations == pytest.approx([want] * 8)
    assert again.iteration_time_s > keep.iteration_time_s
    assert again.peak_memory_bytes[1] < keep.peak_memory_bytes[1]
    assert [again.peak_memory_bytes[r] for r in (0, 2, 3)] == [keep.peak_memory_bytes[r] for r in (0, 2, 3)]


def test_the_recompute_is_inside_the_backward_action_so_its_overhead_is_paid_once() -> None:
    """On a device with per-action overheads, the recomputing backward is bwd + overhead + the ops' forward."""
    plan = chain(2, 2, 4)
    cluster = plan_cluster_with_overheads(plan)
    costs = make_costs(plan, F_MS, B_MS)
    per_stage = stage_costs(plan.with_recompute("s0"), costs, cluster.device)
    fwd_over, bwd_over = 0.4, 0.9
    assert per_stage[0].fwd_ms == pytest.approx(2 * F_MS + fwd_over)
    assert per_stage[0].bwd_ms == pytest.approx(2 * B_MS + bwd_over + recompute_extra_ms(2 * F_MS))
    assert per_stage[1].bwd_ms == pytest.approx(2 * B_MS + bwd_over)


def plan_cluster_with_overheads(plan):  # type: ignore[no-untyped-def]
    from graphpipe.cost.cluster import Cluster

    cluster = Cluster.from_dict(plan.cluster)
    device = dataclasses.replace(cluster.device, fwd_action_overhead_us=400.0, bwd_action_overhead_us=900.0)
    return dataclasses.replace(cluster, device=device)


@pytest.mark.parametrize("name", ["chain", "diamond", "kfkb-up", "dp"])
def test_simulated_peak_agrees_with_the_memory_formula_when_recomputing(name: str) -> None:
    plans = {"chain": lambda: chain(4, 2, 16, bytes_per_sample=50.0),
             "diamond": lambda: diamond(2, 16, bytes_per_sample=50.0),
             "kfkb-up": lambda: make_plan([(0, 1), (1, 2)], [2, 4, 8], 32, bytes_per_sample=50.0),
             "dp": lambda: make_plan([(0, 1), (1, 2)], [4, 4, 4], 32, ranks_per_stage=[1, 2, 1],
                                     bytes_per_sample=50.0)}
    plan = plans[name]().with_recompute("all")
    costs = make_costs(plan, act_bytes=1000, param_bytes=10**6)
    result = simulate(plan, costs, schedule="kfkb" if name == "kfkb-up" else "1f1b")
    for stage in plan.stages:
        share = stage.micro_batch_size / stage.data_parallel_degree
        act = costs.at(stage.ops[0], share).act_bytes
        inputs = recompute_input_bytes(plan, stage, costs)
        assert inputs == round(sum(e.bytes_per_sample for e in plan.edges if e.dst == stage.idx) * share)
        expected = stage_memory_bytes(10**6, act, stage.in_flight_samples, stage.micro_batch_size,
                                      recompute_input_bytes=inputs)
        assert all(result.peak_memory_bytes[rank] == int(expected) for rank in stage.ranks), stage


def test_model_inputs_count_among_a_recomputing_stages_inputs() -> None:
    plan = dataclasses.replace(chain(2, 2, 4), input_batch_axes={"op0": 0})
    costs = make_costs(plan)
    entries = {op: {1: dataclasses.replace(cost[1], output_bytes=30)} for op, cost in costs.entries.items()}
    costs = dataclasses.replace(costs, entries=entries)
    assert recompute_input_bytes(plan, plan.stages[0], costs) == 60  # op0 is a model input: 2 samples x 30
    assert recompute_input_bytes(plan, plan.stages[1], costs) == 0  # bytes_per_sample 0, no model input


def test_k_max_when_recomputing() -> None:
    """The weights and one micro-batch's activations first, then one input per held micro-batch."""
    limit = static_memory_bytes(100) + 1000 + 10 * 50
    assert max_in_flight_micro_batches_recompute(100, 50, 1000, limit) == 10
    assert max_in_flight_micro_batches_recompute(100, 50, 1000, limit, num_micro_batches=8) > 10**6
    assert max_in_flight_micro_batches_recompute(100, 50, 1000, static_memory_bytes(100) + 999) == -1
    assert max_in_flight_micro_batches(100, 1000, limit) == 1  # keeping everything: one micro-batch fits
    assert recompute_activation_bytes(50, 1000, 0) == 0.0
    assert recompute_compute_ms(1.0, 2.0) == 4.0


# ---- the plan's predictions ---------------------------------------------------------------------------
def test_recompute_plan_follows_the_stage_cost_rule_on_every_planners_plans() -> None:
    """The one stage-cost rule with recomputation: a recomputing stage's TPS is the closed form with compute
    fwd + bwd + fwd, its backward the plan's plus the ops' forward, the simulator's backward that number; its
    memory the formula's, which the simulated peak equals; and switching back gives the planner's numbers."""
    graph, cluster = tied_graph(), summit(8)
    costs = tied_costs(graph)
    for planner in ("graphpipe", "sequential", "pipedream"):
        for plan in plan_candidates(graph, costs, cluster, 32, planner=planner)[:3]:
            model = CostModel(graph, costs, cluster, plan.global_batch_size)
            again = recompute_plan(plan, "all", costs, cluster)
            result = simulate(again, costs, cluster, again.schedule)
            simulated = stage_costs(again, costs, cluster.device)
            for before, after in zip(plan.stages, again.stages):
                share = before.micro_batch_size / before.data_parallel_degree
                ops_fwd = sum(costs.at(op, share).fwd_ms for op in before.ops)
                closed = closed_form_tps(model, before.ops, before.data_parallel_degree, before.micro_batch_size)
                assert after.tps_ms == pytest.approx(closed + ops_fwd / before.micro_batch_size, rel=1e-9)
                assert after.bwd_ms == pytest.approx(before.bwd_ms + ops_fwd, rel=EXACT)
                assert simulated[after.idx].bwd_ms == pytest.approx(after.bwd_ms, rel=EXACT)
                durations = [e.duration_ms for e in result.timeline.of_stage(after.idx, "backward")]
                assert durations == pytest.approx([after.bwd_ms] * len(durations), rel=EXACT)
                assert after.recompute and after.fwd_ms == before.fwd_ms
            assert again.predicted_iteration_s == pytest.approx(result.iteration_time_s)
            assert again.predicted_tps_ms == max(stage.tps_ms for stage in again.stages)
            back = recompute_plan(again, "none", costs, cluster)
            for original, restored in zip(plan.stages, back.stages):
                assert restored.bwd_ms == pytest.approx(original.bwd_ms, rel=EXACT)
                assert restored.tps_ms == pytest.approx(original.tps_ms, rel=EXACT)
                assert abs(restored.memory_bytes - original.memory_bytes) <= 1


def test_recompute_plan_memory_is_the_simulated_peak_where_the_planner_agrees_with_the_simulator() -> None:
    plan = chain(4, 2, 16, bytes_per_sample=50.0)
    costs = make_costs(plan, act_bytes=1000, param_bytes=10**6)
    keep_peak = simulate(plan, costs).peak_memory_bytes
    planned = dataclasses.replace(plan, stages=tuple(
        dataclasses.replace(stage, memory_bytes=keep_peak[stage.ranks[0]]) for stage in plan.stages))
    again = recompute_plan(planned, "s0,s2", costs)
    peak = simulate(again, costs).peak_memory_bytes
    assert [stage.memory_bytes for stage in again.stages] == [peak[stage.ranks[0]] for stage in again.stages]
    assert again.stages[0].memory_bytes < planned.stages[0].memory_bytes
    assert again.recompute_stages == (0, 2)


def test_a_simresult_round_trips_its_recomputing_stages() -> None:
    plan = chain(2, 2, 4).with_recompute("s1")
    result = simulate(plan, make_costs(plan))
    assert SimResult.from_dict(result.to_dict()).recompute_stages == (1,)
    assert "recompute_stages" not in simulate(chain(2, 2, 4), make_costs(plan)).to_dict()


def test_the_numpy_twin_of_k_max_when_recomputing_agrees_with_the_scalar() -> None:
    import numpy as np

    from graphpipe.cost.formulas.memory import max_in_flight_micro_batches_recompute_array

    rng = np.random.default_rng(0)
    params = rng.integers(0, 2000, 200).astype(float)
    inputs = rng.integers(0, 300, 200).astype(float)
    acts = rng.integers(0, 3000, 200).astype(float)
    limit, num, cap = 9000.0, 12, 40
    got = max_in_flight_micro_batches_recompute_array(params, inputs.copy(), acts, limit, num, cap)
    for p, i, a, k in zip(params, inputs, acts, got):
        want = max_in_flight_micro_batches_recompute(p, i, a, limit, num)
        assert k == (cap if want > cap else want), (p, i, a)
