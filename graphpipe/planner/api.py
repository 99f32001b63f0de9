"""Planner registry and `plan_candidates`: the best validated plan per micro-batch size.

Every planner maps a `PlanRequest` to partitions (one or more per micro-batch size); this
module checks the request, turns partitions into `Plan`s, validates them, and explains
infeasible requests with numbers.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Collection
from typing import Any

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.memory import static_memory_bytes
from graphpipe.errors import PlanningError
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.baselines.exhaustive import plan_exhaustive
from graphpipe.planner.baselines.parallel_only import plan_parallel_only
from graphpipe.planner.baselines.pipedream import plan_pipedream
from graphpipe.planner.baselines.piper import plan_piper
from graphpipe.planner.baselines.sequential import plan_sequential
from graphpipe.planner.build import build_plan
from graphpipe.planner.granularity import boundary_blocks, refine_limit
from graphpipe.planner.graphpipe_planner import plan_graphpipe
from graphpipe.planner.options import PlanOptions, plan_options
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.stage_spec import Partition
from graphpipe.stages.stage_graph import Plan
from graphpipe.stages.validate import validate_plan
from graphpipe.units import format_bytes

PlannerFn = Callable[[PlanRequest], list[Partition]]


PLANNERS: dict[str, PlannerFn] = {
    "graphpipe": plan_graphpipe, "sequential": plan_sequential, "parallel-only": plan_parallel_only,
    "pipedream": plan_pipedream, "piper": plan_piper, "exhaustive": plan_exhaustive,
}
PLANNER_NAMES: tuple[str, ...] = tuple(PLANNERS)


def default_micro_batch_sizes(global_batch_size: int) -> tuple[int, ...]:
    """Powers of two that divide the mini-batch."""
    sizes, size = [], 1
    while size <= global_batch_size:
        if global_batch_size % size == 0:
            sizes.append(size)
        size *= 2
    return tuple(sizes)


# Micro-batches per iteration beyond which planning is refused: the schedules and their simulation hold every
# one (100,001 micro-batches of mmt-tiny on 2 devices: 6 s and +250 MB; 2 million: minutes, several GB).
MAX_MICRO_BATCHES = 100_000


def micro_batch_count_problem(global_batch_size: int, micro_batch_sizes: Collection[int] | None) -> str | None:
    """A mini-batch that even its largest micro-batch size (of `micro_batch_sizes` that divide it, default
    the powers of two) splits into more than MAX_MICRO_BATCHES, in one line with a mini-batch that plans;
    None otherwise (or where no size divides it: `make_request` says so)."""
    sizes = [s for s in micro_batch_sizes or default_micro_batch_sizes(global_batch_size)
             if s >= 1 and global_batch_size % s == 0]
    if not sizes or global_batch_size // max(sizes) <= MAX_MICRO_BATCHES:
        return None
    largest = max(sizes)
    step = 1 << math.ceil(math.log2(global_batch_size / MAX_MICRO_BATCHES))  # a micro-batch size that would do
    near = global_batch_size // step * step
    return (f"a mini-batch of {global_batch_size:,} samples splits into at least {global_batch_size // largest:,} "
            f"micro-batches (its largest micro-batch size is {largest}), and planning simulates every one of them "
            f"(more than {MAX_MICRO_BATCHES:,} take minutes and gigabytes): plan a mini-batch with a larger "
            f"power-of-two factor, e.g. {near} (= {near // step} x {step}), or a smaller one")


def make_request(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
                 options: PlanOptions | None = None, *, every_size: bool = False, open_blocks: Collection[str] = (),
                 **fields: Any) -> PlanRequest:
    """Check the request and fill in defaults (`options`, or its fields as keywords: `PlanOptions`)."""
    opts = plan_options(options, fields)
    if opts.planner not in PLANNERS:
        raise PlanningError(f"unknown planner {opts.planner!r}; choose one of {', '.join(PLANNER_NAMES)}")
    if global_batch_size < 1:
        raise PlanningError(f"the mini-batch must hold at least 1 sample, got {global_batch_size}")
    wanted = opts.micro_batch_sizes
    too_many = micro_batch_count_problem(global_batch_size, wanted)
    if too_many:
        raise PlanningError(too_many)
    if wanted is None:
        sizes = default_micro_batch_sizes(global_batch_size)
    else:
        sizes = tuple(sorted({s for s in wanted if s >= 1 and global_batch_size % s == 0}))
        if not sizes:
            raise PlanningError(f"no micro-batch size in {list(wanted)} divides the mini-batch of "
                                f"{global_batch_size}: pick sizes that divide it, e.g. "
                                f"{list(default_micro_batch_sizes(global_batch_size))}")
    limit = float(opts.memory_limit) if opts.memory_limit is not None else float(cluster.device.memory_bytes)
    return PlanRequest(graph=graph, costs=costs, cluster=cluster, global_batch_size=global_batch_size,
                       micro_batch_sizes=sizes, memory_limit=limit, per_stage_micro_batch=opts.per_stage_micro_batch,
                       every_size=every_size, options=opts, granularity=opts.granularity,
                       open_blocks=frozenset(open_blocks))


def plan_candidates(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int,
                    options: PlanOptions | None = None, *, every_size: bool = False,
                    open_blocks: Collection[str] = (), **fields: Any) -> tuple[Plan, ...]:
    """The best plan per micro-batch size (best predicted TPS first), each validated. The sizes that cannot
    hold the best TPS are searched to 5% of their own best, unless `every_size` asks for full precision and
    a shallower alternative per size (for `gp.plan`'s ranking by simulation). `options` (or its fields as
    keywords) as for `gp.plan`: `PlanOptions`.

    `granularity` (`graphpipe.planner.granularity`): what the planners cut between; the layer blocks in
    `open_blocks` stay at op level. "auto" returns the layer-level candidates together with those of a
    second search with the blocks at the stage boundaries of the best-TPS one opened (`gp.plan` opens
    those of the plan its own ranking picks instead)."""
    start = time.perf_counter()
    request = make_request(graph, costs, cluster, global_batch_size, options, every_size=every_size,
                           open_blocks=open_blocks, **fields)
    planner, granularity = request.options.planner, request.granularity
    if granularity != "auto" or open_blocks:
        plans = _candidates(request, planner)
    else:
        plans = _auto_candidates(request, planner)
    elapsed = time.perf_counter() - start
    return tuple(dataclasses.replace(plan, search_time_s=elapsed, granularity=granularity)
                 for plan in sorted(plans, key=lambda p: p.predicted_tps_ms))


def _auto_candidates(request: PlanRequest, planner: str) -> tuple[Plan, ...]:
    """Layer-level plans plus those with the blocks around the best one's stage boundaries opened (at most
    `refine_limit` of them: `graphpipe.planner.granularity`). A layer
    level with no plan (a layer too large for a device) falls back to op level; a refinement with none
    (Piper out of downsets) leaves the layer-level plans."""
    try:
        plans = _candidates(request, planner)
    except PlanningError:
        return _candidates(dataclasses.replace(request, granularity="op"), planner)
    opened = boundary_blocks(request.graph, plans[0], request.blocks, refine_limit(len(request.blocks)))
    if not opened:
        return plans
    try:
        return plans + _candidates(dataclasses.replace(request, open_blocks=opened), planner)
    except PlanningError:
        return plans


def _candidates(request: PlanRequest, planner: str) -> tuple[Plan, ...]:
    """The planner's plans for `request`, validated, best predicted TPS first."""
    partitions = PLANNERS[planner](request)
    if not partitions:
        raise PlanningError(_infeasible_message(request))
    plans = sorted((build_plan(request.model, partition, planner) for partition in partitions),
                   key=lambda p: p.predicted_tps_ms)
    for plan in plans:
        validate_plan(plan, request.graph, request.cluster, memory_limit=request.memory_limit)
    return tuple(plans)


GIB = 2**30
SMALL = 0.01 * GIB  # below this, a size in GiB to two places would read 0.00


def _infeasible_message(request: PlanRequest) -> str:
    model = request.model
    limit = request.memory_limit
    heaviest = max(request.graph.names, key=lambda op: model.param_bytes[op])
    op_static = static_memory_bytes(model.param_bytes[heaviest])
    if op_static > limit:
        return (f"op {heaviest!r} alone needs {_size(op_static)} for weights, gradients and Adam state "
                f"(4 x {_size(model.param_bytes[heaviest])}) but a device has {_size(limit)}: "
                "use devices with more memory or split the op")
    total_static = static_memory_bytes(sum(model.param_bytes.values()))
    smallest = min(request.micro_batch_sizes)
    acts = sum(model.op_at(op, smallest)[2] for op in request.graph.names)
    needed, devices = total_static + acts, request.num_devices
    head = (f"no plan fits: the model needs {_size(total_static)} for weights, gradients and Adam state "
            f"plus {_size(acts)} of activations per micro-batch of {smallest}")
    smaller = ["fewer samples per micro-batch (--micro-batch-sizes)"] if smallest > 1 else []
    again = [] if "recompute" in request.options.techniques else \
        ["stages that recompute their forward (--techniques recompute)"]
    if needed > devices * limit:  # not even the total fits: say how many devices, or how much memory, it takes
        share = needed / devices
        at_least = math.ceil(share / GIB * 100) / 100 * GIB if share >= SMALL else share
        fixes = [f"at least {math.ceil(needed / limit)} devices of {_size(limit)}",
                 f"devices of at least {_size(at_least)}", *smaller, *again]  # rounded up
        return f"{head}, more than {devices} devices of {_size(limit)} hold together: use {', or '.join(fixes)}"
    fixes = ["more devices", "devices with more memory", *smaller, *again]
    return (f"{head}, which {devices} devices of {_size(limit)} hold together, but no split into stages "
            "fits every device (each keeps the weights of its stage and the activations of the micro-batches it "
            f"has in flight): use {', or '.join(fixes)}")


def _size(num_bytes: float) -> str:
    """GiB to two places, as the limits are given, down to SMALL; below it in the unit that shows the number."""
    return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= SMALL else format_bytes(num_bytes)
