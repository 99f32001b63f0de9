"""`graphpipe show plan.json -o stages.png`: the stage graph as a table and a picture."""

from __future__ import annotations

import argparse
from typing import Any

from graphpipe.cli.common import print_json
from graphpipe.cli.simulate_cmd import format_table
from graphpipe.schedule.generate import SCHEDULE_NAMES
from graphpipe.stages.stage_graph import Plan
from graphpipe.units import format_bytes


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("show", help="draw a plan's stage graph and list its stages",
                                   description="List a plan's stages (ops, ranks, micro-batch, in-flight samples, "
                                               "neighbours, recomputation) and draw the stage graph as PNG or SVG.")
    parser.add_argument("plan", help="plan JSON written by `graphpipe plan -o`")
    parser.add_argument("-o", "--output", default=None, metavar="STAGES.png",
                        help="write the stage graph picture here (.png or .svg)")
    parser.add_argument("--schedule", choices=SCHEDULE_NAMES, default=None,
                        help="also print this schedule's forwards and backwards as a stage × step grid")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = Plan.load(args.plan)
    written = []
    if args.output:
        from graphpipe.simulation.stage_picture import render_stage_graph

        written.append(render_stage_graph(plan, args.output))
    if args.json:
        print_json({**plan.to_dict(), "depth": plan.depth, "written": written})
        return 0
    print(f"plan {plan.graph_name} ({plan.planner}): {plan.num_stages} stages, depth {plan.depth}, "
          f"{plan.world_size} devices, mini-batch {plan.global_batch_size}, schedule {plan.schedule}")
    print(render_cost_source(plan))
    print(render_stages(plan))
    if plan.recompute_stages:
        print("recompute: " + ",".join(f"s{idx}" for idx in plan.recompute_stages) + " run their forward again in "
              "their backward and keep only their inputs per micro-batch in flight")
    if args.schedule:
        from graphpipe.schedule.generate import make_schedule
        from graphpipe.schedule.grid import format_grid

        print(f"\n{args.schedule} schedule (forwards and backwards):")
        print(format_grid(make_schedule(plan, args.schedule), compute_only=True))
    for path in written:
        print(f"wrote {path}")
    return 0


def render_cost_source(plan: Plan) -> str:
    """Which costs the plan was searched with: what `simulate` and `train` cost it with by default."""
    if plan.cost_source is None:
        return "costs: not recorded (the plan predates the record; simulate costs it on its model_spec's device)"
    return f"costs: {plan.cost_source} (simulate and train cost it the same way unless told otherwise)"


def render_stages(plan: Plan) -> str:
    """One row per stage; a `recompute` column when a stage recomputes its forward in its backward."""
    recompute = bool(plan.recompute_stages)
    rows: list[tuple[str, ...]] = [("stage", "ranks", "b", "in-flight", "ops", "first … last op", "from", "to",
                                    "memory") + (("recompute",) if recompute else ())]
    for stage in plan.stages:
        ops = stage.ops[0] if len(stage.ops) == 1 else f"{stage.ops[0]} … {stage.ops[-1]}"
        rows.append((f"s{stage.idx}", ",".join(map(str, stage.ranks)), str(stage.micro_batch_size),
                     str(stage.in_flight_samples), str(len(stage.ops)), ops,
                     ",".join(f"s{p}" for p in plan.predecessors[stage.idx]) or "-",
                     ",".join(f"s{s}" for s in plan.successors[stage.idx]) or "-",
                     format_bytes(stage.memory_bytes) if stage.memory_bytes else "-")
                    + (("yes" if stage.recompute else "no",) if recompute else ()))
    return format_table(rows)
