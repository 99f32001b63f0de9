"""`gp.plan`: search stage graphs, then pick the candidate that trains fastest.

The planners optimise the bottleneck stage's time per sample (TPS), which ignores warm-up
and cool-down, where graph pipelines gain the most. So the best plan per micro-batch size
is kept, each is simulated (`rank_by="simulation"`), and the one with the shortest
simulated iteration wins (docs/method.md §4, [ours]); `rank_by="tps"` picks by TPS alone. A
candidate whose lower bound on the iteration (its busiest stage's own work) is above the best
simulated so far is not simulated: the winner is the same (`docs/architecture.md`). For the
ranking by simulation every size's plan is searched to full precision (`every_size`), not
only the sizes that could hold the best TPS.
`parallel-only` (the ablation) takes the micro-batch size of the sequential plan that the
same ranking picks. graphpipe's winner then meets its rivals, the `sequential` planner's winner, graphpipe
held to that winner's micro-batch and, at op level, its own layer-level winner, and the fastest of them in
simulation is kept (`_no_slower_than_rivals`): never slower than what it could have chosen itself.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.sources import CostSource
from graphpipe.errors import PlanningError, PlanValidationError
from graphpipe.graph.layers import layer_blocks
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.api import plan_candidates
from graphpipe.planner.build import priced_again
from graphpipe.planner.granularity import boundary_blocks, refine_limit
from graphpipe.planner.notes import batch_coupling_notes, capture_notes
from graphpipe.planner.options import PlanOptions, plan_options
from graphpipe.planner.progress import PlanProgressFn, SizeDone, size_steps
from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.techniques import with_techniques
from graphpipe.stages.stage_graph import Plan
from graphpipe.stages.validate import check_runtime_rules

__all__ = ["plan"]

BOUND_SLACK = 1e-9  # a bound summed in another order than the simulator's clock may be a few ulps above it


def plan(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
         options: PlanOptions | None = None, *, cost_source: CostSource | None = None, **fields: Any) -> Plan:
    """The best plan for training `graph` on `cluster` with mini-batches of `global_batch_size` samples.

    `options` (`PlanOptions`, whose fields may also be given as keywords, e.g. `planner="sequential"`)
    says how: which planner, micro-batch sizes, memory limit, ranking, granularity, limits. A plan may
    leave devices unused when more would not help (the extra ranks stay idle at run time);
    `use_all_devices=True` keeps only candidates that use every device. `granularity` says what the
    planner cuts between: "op", "layer" (whole layers: `graphpipe.graph.layers`) or "auto" (layer level,
    then the blocks at the winner's stage boundaries opened to op level, the better of the two kept:
    `graphpipe.planner.granularity`). The plan records `cost_source` (from `graphpipe.cost.sources.choose_costs`;
    by default read off the table: the analytic model on its device, or measured) so that it is costed the
    same way when read back."""
    opts = plan_options(options, fields)
    start = time.perf_counter()
    search = functools.partial(_plan_at, graph, costs, cluster, global_batch_size, opts)
    best = _auto(graph, search) if opts.granularity == "auto" else _found(search(opts.granularity))
    if opts.planner == "graphpipe" and opts.rank_by == "simulation":
        best = _no_slower_than_rivals(graph, costs, cluster, global_batch_size, opts, best)
    notes = best.notes + batch_coupling_notes(graph, best) + capture_notes(graph, best)
    return dataclasses.replace(best, search_time_s=time.perf_counter() - start, planner=opts.planner,
                               granularity=opts.granularity, notes=notes,
                               cost_source=cost_source or CostSource.of_table(costs))


def _auto(graph: OpGraph, search: Callable[..., Plan | None]) -> Plan:
    """The layer-level winner, or the winner with the blocks at its stage boundaries (at most `refine_limit`)
    opened to op level when that one is faster (`graphpipe.planner.granularity`); op level when layer level
    has no plan at all. The refined candidates are ranked against the layer-level winner: those whose
    lower bound is above its iteration are not simulated (with many candidates near the layer-level ones,
    the simulations cost more than the search)."""
    try:
        layer = _found(search("layer"))
    except PlanningError as err:
        _unless_a_bug(err)
        return _found(search("op"))
    blocks = layer_blocks(graph)
    opened = boundary_blocks(graph, layer, blocks, refine_limit(len(blocks)))
    if not opened:
        return layer
    try:
        refined = search("layer", frozenset(opened), beat_s=layer.predicted_iteration_s)
    except PlanningError as err:  # e.g. Piper out of downsets on the finer graph
        _unless_a_bug(err)
        return layer
    return refined if refined is not None and refined.predicted_iteration_s < layer.predicted_iteration_s else layer


def _no_slower_than_rivals(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
                           opts: PlanOptions, best: Plan) -> Plan:
    """`best`, or the plan of a rival search if that one simulates faster, with a note saying so. The rivals are
    what graphpipe could have chosen itself: the `sequential` planner's winner under the same options (every
    chain is a stage graph; graphpipe searches chains only under its best graph pipeline's TPS, and TPS is
    not what the simulation ranks), graphpipe held to that chain's micro-batch (the `parallel-only` ablation:
    a one-size search keeps other near-best plans than the search over every size) and, at op level, its own
    layer-level winner with its own rivals (every layer-level plan is an op-level plan; the op-level search
    keeps the best TPS per micro-batch size, not the best simulation). So the winner is never slower, in the
    simulated iteration, than any of them (`docs/architecture.md`)."""
    chain = _rival(graph, costs, cluster, global_batch_size, opts.with_fields(
        planner="sequential", progress=_labelled(opts.progress, "rival: sequential")))
    best = _faster(best, chain, "the sequential planner's chain")
    if chain is not None:
        size = chain.stages[0].micro_batch_size
        held = _rival(graph, costs, cluster, global_batch_size, opts.with_fields(
            planner="parallel-only", fixed_micro_batch=size,
            progress=_labelled(opts.progress, "rival: held to the chain's micro-batch")), best.predicted_iteration_s)
        best = _faster(best, held, f"graphpipe's plan at the chain's micro-batch ({size})")
    if opts.granularity == "op" and layer_blocks(graph):  # without layers, layer level is op level
        at_layers = opts.with_fields(granularity="layer", progress=_labelled(opts.progress, "rival: layer level"))
        layer = _rival(graph, costs, cluster, global_batch_size, at_layers)
        if layer is not None:  # the layer-level winner as `gp.plan` gives it: with its own rivals
            layer = _no_slower_than_rivals(graph, costs, cluster, global_batch_size, at_layers, layer)
        best = _faster(best, layer, "the layer-level plan")
    return best


def _faster(best: Plan, rival: Plan | None, label: str) -> Plan:
    """`rival`, with a note naming it, where it simulates faster than `best`; else `best`."""
    if rival is None or rival.predicted_iteration_s >= best.predicted_iteration_s:
        return best
    gain = best.predicted_iteration_s / rival.predicted_iteration_s - 1
    note = (f"kept {label}: it simulates {gain:.1%} faster than the best plan of this search "
            f"({rival.predicted_iteration_s * 1e3:.3f} ms against {best.predicted_iteration_s * 1e3:.3f} ms "
            "an iteration)")
    return dataclasses.replace(rival, notes=(*rival.notes, note))


def _labelled(progress: PlanProgressFn | None, label: str) -> PlanProgressFn | None:
    """`progress` with `label` added to every phase: a rival's search says whose it is."""
    if progress is None:
        return None
    return lambda event: progress(dataclasses.replace(event, phase=f"{event.phase} ({label})"))


def _rival(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int, opts: PlanOptions,
           beat_s: float = math.inf) -> Plan | None:
    """The winner under `opts`, if it may beat `beat_s`; None when it cannot or finds no plan. The sequential
    rival is ranked in full (no `beat_s`): its winner's micro-batch names the next rival."""
    search = functools.partial(_plan_at, graph, costs, cluster, global_batch_size, opts)
    try:
        return _auto(graph, search) if opts.granularity == "auto" else search(opts.granularity, beat_s=beat_s)
    except PlanningError as err:
        _unless_a_bug(err)
        return None


def _found(best: Plan | None) -> Plan:
    assert best is not None, "without a time to beat, some candidate is ranked"
    return best


def _unless_a_bug(err: PlanningError) -> None:
    """Re-raise a plan the runtime would refuse: "auto" falls back when a granularity has no plan, never
    past a planner bug."""
    if isinstance(err.__cause__, PlanValidationError):
        raise err


def _plan_at(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int, opts: PlanOptions,
             granularity: str, open_blocks: frozenset[str] = frozenset(), *, beat_s: float = math.inf) -> Plan | None:
    """The best plan at one granularity ("op" or "layer", less `open_blocks`), ranked and checked; None when
    a ranking by simulation finds no candidate whose lower bound is below `beat_s` (an iteration time)."""
    planner, rank_by = opts.planner, opts.rank_by
    if planner == "parallel-only" and opts.fixed_micro_batch is None:
        chain = opts.with_fields(planner="sequential", use_all_devices=False)
        sequential = _found(_plan_at(graph, costs, cluster, global_batch_size, chain, granularity, open_blocks))
        opts = opts.with_fields(fixed_micro_batch=sequential.stages[0].micro_batch_size)
    candidates = _candidates_with_techniques(graph, costs, cluster, global_batch_size, opts, granularity, open_blocks)
    if opts.use_all_devices:
        candidates = _using_all(candidates, cluster.num_devices, planner)
    if rank_by == "tps":
        best = min(candidates, key=lambda p: p.predicted_tps_ms)
        iteration_s = best.global_batch_size * best.predicted_tps_ms / 1e3
        best = dataclasses.replace(best, predicted_iteration_s=iteration_s)
    else:
        ranked = _best_simulated(candidates, costs, cluster, beat_s,
                                 size_steps(opts.progress, "ranking", len(candidates), bool(open_blocks)))
        if ranked is None:
            return None
        iteration_s, best = ranked
        samples_per_s = best.global_batch_size / iteration_s if iteration_s > 0 else 0.0
        best = dataclasses.replace(best, predicted_iteration_s=iteration_s, predicted_samples_per_s=samples_per_s)
    try:
        check_runtime_rules(best, graph)
    except PlanValidationError as err:
        raise PlanningError(f"planner {planner!r} returned a plan the runtime would refuse (a planner bug): "
                            f"{err}") from err
    return best


def _candidates_with_techniques(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
                                opts: PlanOptions, granularity: str, open_blocks: frozenset[str]) -> tuple[Plan, ...]:
    """The planner's candidates at one granularity, and those its `techniques` add (`with_techniques`). With
    recomputation, a memory limit under which no plan fits leaves the plans that fit by recomputing."""
    def search_on(table: CostTable, label: str | None = None) -> tuple[Plan, ...]:
        progress = opts.progress if label is None else _labelled(opts.progress, label)
        return plan_candidates(graph, table, cluster, global_batch_size,
                               opts.with_fields(granularity=granularity, progress=progress),
                               every_size=opts.rank_by == "simulation", open_blocks=open_blocks)

    if not opts.techniques:
        return search_on(costs)
    unfit: PlanningError | None = None
    try:
        plain = search_on(costs)
    except PlanningError as err:
        if "recompute" not in opts.techniques:
            raise
        plain, unfit = (), err
    model = CostModel(graph, costs, cluster, global_batch_size)
    limit = float(opts.memory_limit) if opts.memory_limit is not None else float(cluster.device.memory_bytes)
    found = with_techniques(plain, opts.techniques, costs, limit, search_on, functools.partial(priced_again, model))
    if not found:
        raise PlanningError(f"{unfit} (nor does any plan fit by recomputing stages)")
    return found


def _using_all(candidates: Sequence[Plan], num_devices: int, planner: str) -> tuple[Plan, ...]:
    full = tuple(candidate for candidate in candidates if candidate.world_size == num_devices)
    if not full:
        most = max((candidate.world_size for candidate in candidates), default=0)
        raise PlanningError(f"no {planner} plan uses all {num_devices} devices (the most any uses is {most}): the "
                            "model is too small to split further at this mini-batch; use fewer devices, a larger "
                            "mini-batch, or let the extra ranks idle (drop --use-all-devices)")
    return full


def _best_simulated(candidates: Sequence[Plan], costs: CostTable, cluster: Cluster, beat_s: float = math.inf,
                    simulated: SizeDone | None = None) -> tuple[float, Plan] | None:
    """(simulated iteration seconds, plan) of the fastest candidate; ties go to the smaller TPS, then to the
    earlier candidate. Candidates are simulated by increasing lower bound (`plan_bounds`), and
    those whose bound is above the best iteration so far, or above `beat_s`, are skipped: they could not
    win, and they are the slow ones to simulate (many micro-batches). A simulation also stops as soon as
    its iteration is certain to be longer than the best so far (`iteration_time_s`). None when every
    bound is above `beat_s`. `simulated` is called with each candidate's micro-batch size once it is
    ranked, simulated or not (progress)."""
    from graphpipe.simulation.simulator import iteration_time_s, plan_bounds

    per_plan = [plan_bounds(candidate, costs, cluster) for candidate in candidates]
    bounds = sorted((found.lower_bound_s, idx) for idx, found in enumerate(per_plan))
    best: tuple[tuple[float, float, int], Plan] | None = None
    for rank, (bound, idx) in enumerate(bounds):
        to_beat = min(beat_s, best[0][0] if best is not None else math.inf) * (1 + BOUND_SLACK)
        if bound > to_beat:
            if simulated is not None:
                for _, rest in bounds[rank:]:  # ranked without a simulation
                    simulated(candidates[rest].stages[0].micro_batch_size)
            break  # sorted: no later candidate can win either
        candidate = candidates[idx]
        iteration_s = iteration_time_s(candidate, costs, cluster, candidate.schedule, to_beat, per_plan[idx])
        if simulated is not None:
            simulated(candidate.stages[0].micro_batch_size)
        if iteration_s is None:
            continue
        key = (iteration_s, candidate.predicted_tps_ms, idx)
        if best is None or key < best[0]:
            best = (key, candidate)
    if best is None:
        if math.isinf(beat_s):
            raise PlanningError("no candidate plan to rank")
        return None
    return best[0][0], best[1]
