"""`graphpipe plan`: search a stage graph for a model on a cluster and write it as JSON."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from graphpipe.cli.common import (
    add_granularity_arg,
    add_model_args,
    capture_from_args,
    check_output_files,
    memory_gib,
    positive_int,
    print_json,
    writing,
)
from graphpipe.cli.plan_progress import PlanProgressBar
from graphpipe.cli.recompute_arg import add_recompute_arg, apply_recompute
from graphpipe.errors import PlanningError, UsageError
from graphpipe.graph.layers import layer_blocks, layer_unit_count
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, SPParallel, sp_decompose, stage_units
from graphpipe.planner.api import PLANNER_NAMES
from graphpipe.stages.stage_graph import Plan
from graphpipe.units import format_bytes

LARGE_OP_GRAPH = 2000  # op-level units from which an op-level plan points to --granularity layer
NESTED_BLOCKS = 8  # parallel blocks inside branches from which an op-level graphpipe plan is warned of first


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan", help="partition a model into a graph of pipeline stages",
        description="Capture the model, cost it, and search the stage graph (ops, devices, micro-batch) with "
                    "the GraphPipe planner or a baseline; print the stages and write the plan as JSON.")
    add_model_args(parser, default_preset="paper")
    parser.add_argument("--cluster", default="summit", help="cluster preset (default summit)")
    parser.add_argument("--devices", type=positive_int, required=True, help="number of devices")
    parser.add_argument("--mini-batch", "--global-batch", dest="global_batch", type=positive_int, default=None,
                        help="mini-batch size to plan for (default: --batch, else 128)")
    parser.add_argument("--planner", choices=PLANNER_NAMES, default="graphpipe", help="default graphpipe")
    parser.add_argument("--micro-batch-sizes", default=None, metavar="1,2,4",
                        help="micro-batch sizes to try (default: powers of two dividing the mini-batch)")
    parser.add_argument("--memory-limit", "--memory-limit-gib", dest="memory_limit_gib", type=memory_gib, default=None,
                        metavar="SIZE", help="per-device memory: GiB, or with a unit (512MiB, 0.38GiB); "
                                             "default: the device's")
    parser.add_argument("--rank-by", choices=("simulation", "tps"), default="simulation",
                        help="pick among the best plan per micro-batch size by simulated iteration time or TPS")
    parser.add_argument("--costs", default=None, metavar="COSTS.json",
                        help="cost table from `graphpipe profile` (default: analytic; the plan records which)")
    parser.add_argument("--device", default=None,
                        help="device preset for analytic costs (default: the cluster's, e.g. cpu for local-cpu)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="activation precision the analytic costs count (bf16: training under autocast)")
    parser.add_argument("--use-all-devices", action="store_true",
                        help="keep only plans that use every device (default: a plan may leave some idle)")
    add_granularity_arg(parser)
    add_techniques_arg(parser)
    add_recompute_arg(parser, "stages of the chosen plan that recompute their forward in their backward, set after the "
                              "search: all, none, or stages such as s1,s3 (to let the planner choose, "
                              "--techniques recompute)")
    add_planner_limit_args(parser)
    parser.add_argument("-o", "--output", default=None, metavar="PLAN.json", help="write the plan here")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def add_techniques_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--techniques", default="none", metavar="LIST",
                        help="what the planner may also choose, ranked by simulation like the rest: recompute "
                             "(stages recompute their forward where a plan needs more memory than a device has), "
                             "zero-bubble (the split-backward schedule), all, or none (default)")


def parse_techniques_arg(text: str) -> tuple[str, ...]:
    """--techniques as `PlanOptions.techniques`; UsageError naming the flag and the known names."""
    from graphpipe.planner.options import parse_techniques

    try:
        return parse_techniques(text)
    except PlanningError as err:
        raise UsageError(f"--techniques {text}: {err}") from None


def add_planner_limit_args(parser: argparse.ArgumentParser) -> None:
    """--max-downsets, --max-explored, --time-limit: the budgets of the Piper (and PipeDream) searches."""
    parser.add_argument("--max-downsets", type=positive_int, default=None, metavar="N",
                        help="piper: give up on a graph with more downsets than this (default 40,000, as the "
                             "original Piper)")
    parser.add_argument("--max-explored", type=positive_int, default=None, metavar="N",
                        help="piper: stop counting downsets at this many (default 200,000, as the original Piper)")
    parser.add_argument("--time-limit", type=positive_seconds, default=None, metavar="S",
                        help="piper and pipedream: give up after S seconds (default: their own, piper 600)")


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def granularity_hint(graph: OpGraph) -> str | None:
    """For an op-level plan of a deep model (at least LARGE_OP_GRAPH units): how few units its layer level has.
    The DP's segment tables grow with the square of a chain's length, so such a model plans many times faster
    with whole layers (mmt with 4 x 256 layers at 1,024 devices: 22 s and 3.3 GB at op level, 1.9 s and 0.2 GB at
    layer level, the same throughput: docs/architecture.md, "Why the default stays `op`"). None for other graphs."""
    if len(graph) < LARGE_OP_GRAPH:  # a unit holds one op or more: no units to count on a small graph
        return None
    units = stage_units(graph)
    if len(units.keys) < LARGE_OP_GRAPH:
        return None
    blocks = layer_blocks(graph, units)
    if not blocks:
        return None
    return (f"planned at op level, {len(units.keys):,} units; with --granularity layer this model is "
            f"{layer_unit_count(units, blocks):,} units ({len(blocks):,} layers kept whole), which plans a deep "
            "model in a fraction of the time, and --granularity auto then refines the cuts at op level")


def nested_blocks_hint(graph: OpGraph) -> str | None:
    """Before an op-level graphpipe search: a warning where NESTED_BLOCKS parallel blocks or more sit inside the
    branches of another (attention's q, k and v projections inside a tower, say) and layers can be kept whole.
    Around each such block every row of its branch may open a fork run, and a branch holding blocks is solved
    again for every in-flight count and merge tail that asks for it: Hugging Face CLIP's two towers of 24
    layers at op level take about 9x their chain DP's time at 64 devices, about a minute (mini-batch 128:
    `benchmarks/search_time`, `--sweep library`), and under 2 minutes at 512 (mini-batch 512), against 0.2-0.8 s
    at layer level. None for other graphs."""
    units = stage_units(graph)
    nested = _nested_blocks(sp_decompose(graph, units))
    if nested < NESTED_BLOCKS:
        return None
    blocks = layer_blocks(graph, units)
    if not blocks:
        return None
    return (f"at op level this model has {nested:,} parallel blocks inside the branches of others, which can make "
            "the graph-pipeline search take minutes on many devices; with --granularity layer it is "
            f"{layer_unit_count(units, blocks):,} units ({len(blocks):,} layers kept whole) and plans in seconds, "
            "and --granularity auto then refines the cuts at op level")


def _nested_blocks(chain: SPChain, depth: int = 0) -> int:
    """Parallel blocks inside a branch of another block, at any depth."""
    count = 0
    for item in chain.items:
        if isinstance(item, SPParallel):
            count += (depth > 0) + sum(_nested_blocks(branch, depth + 1) for branch in item.branches)
    return count


def planner_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The PlanOptions fields of the planner budget flags."""
    return {"max_downsets": args.max_downsets, "max_explored": args.max_explored, "time_limit_s": args.time_limit}


def run(args: argparse.Namespace) -> int:
    from graphpipe.cli.simulate_cmd import model_spec_from_args
    from graphpipe.cost.cluster import Cluster
    from graphpipe.cost.sources import choose_costs
    from graphpipe.planning import plan
    from graphpipe.train import ACTIVATION_DTYPES

    global_batch = args.global_batch or args.batch or 128
    sizes = parse_sizes(args.micro_batch_sizes, global_batch)
    techniques = parse_techniques_arg(args.techniques)
    check_output_files(("-o", args.output, "plan.json"))
    _, graph = capture_from_args(args)
    cluster = Cluster.preset(args.cluster, args.devices)
    costs, source = choose_costs(graph, costs_file=args.costs, device=args.device, cluster=cluster,
                                 dtype=ACTIVATION_DTYPES[args.dtype])
    limit = args.memory_limit_gib * 2**30 if args.memory_limit_gib is not None else None
    warning = nested_blocks_hint(graph) if args.granularity == "op" and args.planner == "graphpipe" else None
    if warning:
        print(f"graphpipe plan: note: {warning}", file=sys.stderr, flush=True)
    with PlanProgressBar(args.planner) as progress:
        result = plan(graph, costs, cluster, global_batch, planner=args.planner, micro_batch_sizes=sizes,
                      memory_limit=limit, rank_by=args.rank_by, use_all_devices=args.use_all_devices,
                      granularity=args.granularity, techniques=techniques, cost_source=source, progress=progress,
                      **planner_limits(args))
    result = dataclasses.replace(apply_recompute(result, args.recompute, costs, cluster),
                                 model_spec=model_spec_from_args(args, source.device))
    if args.output:
        with writing("-o", args.output):
            result.save(args.output)
    if args.json:
        print_json(result.to_dict())
    else:
        print(render_plan(result))
        print(f"costs: {source}")
        if result.recompute_stages:
            print("recompute: " + ",".join(f"s{idx}" for idx in result.recompute_stages))
        if techniques:
            print(f"schedule: {result.schedule}")
        hint = granularity_hint(graph) if args.granularity == "op" else None
        for note in (*result.notes, *([hint] if hint else [])):
            print(f"note: {note}")
        if args.output:
            print(f"wrote {args.output}")
    return 0


def parse_sizes(text: str | None, mini_batch: int) -> tuple[int, ...] | None:
    """--micro-batch-sizes as integers from 1 to the mini-batch, at least one dividing it; UsageError naming
    the size that cannot be, or a mini-batch too large to plan (`micro_batch_count_problem`)."""
    from graphpipe.planner.api import default_micro_batch_sizes, micro_batch_count_problem

    sizes = _integers(text) if text is not None else None
    fits = list(default_micro_batch_sizes(mini_batch))
    for size in sizes or ():
        if not 1 <= size <= mini_batch:
            raise UsageError(f"--micro-batch-sizes {text}: {size} is not a micro-batch size of the mini-batch of "
                             f"{mini_batch} (from 1 to {mini_batch}); give sizes that divide it, e.g. {fits}")
    if sizes is not None and not any(mini_batch % size == 0 for size in sizes):
        raise UsageError(f"--micro-batch-sizes {text}: none divides the mini-batch of {mini_batch}; give sizes that "
                         f"divide it, e.g. {fits}")
    problem = micro_batch_count_problem(mini_batch, sizes)
    if problem:
        raise UsageError(f"--mini-batch {mini_batch}: {problem}")
    return sizes


def _integers(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes:
        raise UsageError(f"--micro-batch-sizes {text!r}: write whole numbers separated by commas, e.g. 1,2,4")
    return sizes


def ops_summary(ops: tuple[str, ...]) -> str:
    return ops[0] if len(ops) == 1 else f"{ops[0]}..{ops[-1]} ({len(ops)})"


def render_plan(plan: Plan) -> str:
    header = ("stage", "ops", "ranks", "b", "in-flight", "TPS ms", "memory")
    rows = [(f"s{s.idx}", ops_summary(s.ops), _ranks(s.ranks), str(s.micro_batch_size), str(s.in_flight_samples),
             f"{s.tps_ms:.4f}", format_bytes(s.memory_bytes)) for s in plan.stages]
    widths = [max(len(row[col]) for row in [header, *rows]) for col in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.append(f"{plan.planner}: {plan.num_stages} stages, depth {plan.depth}, {plan.world_size} of "
                 f"{plan.num_devices} devices, mini-batch {plan.global_batch_size}; predicted "
                 f"{plan.predicted_samples_per_s:,.1f} samples/s (bound {plan.lower_bound_samples_per_s:,.1f}); "
                 + (f"{plan.granularity} granularity; " if plan.granularity != "op" else "")
                 + f"search {plan.search_time_s:.2f} s")
    return "\n".join(lines)


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))
