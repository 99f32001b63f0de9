"""`graphpipe simulate plan.json`: predict an iteration of a saved plan; optional Gantt chart and trace.

Costs are made again as the plan records them (`Plan.cost_source`: the same costs file, or the
analytic model on the same device, of the model in `Plan.model_spec`, else of the zoo name in
`graph_name`, e.g. "mmt-tiny"); `--costs` and `--device` use other costs, with a warning naming
both sources, and `--model`, `--preset` and `--set` override the model the plan says.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphpipe.cli.common import check_output_files, positive_int, print_json, writing
from graphpipe.cli.recompute_arg import add_recompute_arg, apply_recompute
from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.sources import CostSource
from graphpipe.errors import ModelLoadError, UsageError
from graphpipe.graph.op_graph import OpGraph
from graphpipe.schedule.generate import SCHEDULE_NAMES
from graphpipe.simulation.result import SimResult
from graphpipe.stages.stage_graph import Plan
from graphpipe.units import format_bytes


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate", help="predict iteration time, throughput, bubbles and memory of a plan",
        description="Simulate one training iteration of a saved plan (event-driven, per stage and rank) and "
                    "print iteration time, samples/s, the bubble per stage and the memory per device.")
    parser.add_argument("plan", help="plan JSON written by `graphpipe plan -o`")
    add_cost_args(parser)
    parser.add_argument("--cluster", default=None, help="cluster preset to simulate on (default: the plan's)")
    parser.add_argument("--schedule", choices=SCHEDULE_NAMES, default=None, help="schedule (default: the plan's)")
    add_recompute_arg(parser, "simulate with these stages recomputing their forward in their backward instead of "
                              "the plan's choice: all, none, or stages such as s1,s3")
    parser.add_argument("--write-plan", default=None, metavar="PLAN.json",
                        help="write the plan with the --recompute choice, its predictions priced again")
    parser.add_argument("--gantt", default=None, metavar="GANTT.png", help="write a Gantt chart of the iteration")
    parser.add_argument("--trace", default=None, metavar="TRACE.json", help="write a Chrome trace (Perfetto)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run)


def add_cost_args(parser: argparse.ArgumentParser) -> None:
    """Where the costs come from: a file, or the model (overrides for what the plan records)."""
    parser.add_argument("--costs", default=None, metavar="COSTS.json",
                        help="cost table from `graphpipe profile` (default: the costs the plan records)")
    parser.add_argument("--device", default=None,
                        help="device preset for analytic costs (default: the costs the plan records)")
    parser.add_argument("--model", default=None, help="zoo model or file.py:factory (default: the plan's)")
    parser.add_argument("--preset", default=None, help="model preset (default: the plan's)")
    parser.add_argument("--batch", type=positive_int, default=None, help="example batch size for capture")
    parser.add_argument("--set", dest="model_options", action="append", default=[], metavar="KEY=VALUE",
                        help="model option, as for `graphpipe plan` (repeatable)")


def run(args: argparse.Namespace) -> int:
    from graphpipe.simulation.simulator import simulate

    check_output_files(("--gantt", args.gantt, "gantt.png"), ("--trace", args.trace, "trace.json"),
                       ("--write-plan", args.write_plan, "plan.json"))
    if args.write_plan and args.recompute is None:
        raise UsageError("--write-plan writes the plan with another --recompute choice; give --recompute too")
    plan = Plan.load(args.plan)
    costs, source = load_costs(plan, args)
    cluster = Cluster.preset(args.cluster, plan.world_size) if args.cluster else None
    plan = apply_recompute(plan, args.recompute, costs, cluster)
    result = simulate(plan, costs, cluster, schedule=args.schedule or plan.schedule)
    written = write_pictures(result, args.gantt, args.trace, title=f"{plan.graph_name} · {plan.planner}")
    if args.write_plan:
        with writing("--write-plan", args.write_plan):
            plan.save(args.write_plan)
        written.append(args.write_plan)
    if args.json:
        print_json({"plan": args.plan, "costs": costs.source, "cost_source": source.to_dict(), **result.summary(),
                    "written": written})
        return 0
    print(render_result(plan, result, source))
    for path in written:
        print(f"wrote {path}")
    return 0


def write_pictures(result: SimResult, gantt: str | None, trace: str | None, *, title: str = "") -> list[str]:
    from graphpipe.simulation.gantt import render_gantt
    from graphpipe.simulation.trace import write_chrome_trace

    written = []
    if gantt:
        Path(gantt).parent.mkdir(parents=True, exist_ok=True)
        with writing("--gantt", gantt):
            written.append(render_gantt(result, gantt, title=title))
    if trace:
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        with writing("--trace", trace):
            written.append(write_chrome_trace(result, trace))
    return written


# ---- costs ----------------------------------------------------------------------------------
def model_spec_from_args(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """What `Plan.model_spec` records for a model given by --model/--preset/--batch/--set/--leaf-module."""
    from graphpipe.cli.common import model_options

    return {"model": args.model, "preset": args.preset, "batch": args.batch, "options": model_options(args),
            "leaf_modules": list(getattr(args, "leaf_modules", None) or ()), "device": device,
            "capture": getattr(args, "capture", None) or "auto"}


def load_costs(plan: Plan, args: argparse.Namespace, command: str = "simulate") -> tuple[CostTable, CostSource]:
    """The costs the plan records, made again, or `--costs` / `--device` when given (`costs_as_recorded`;
    its warning goes to stderr); UsageError when the plan does not cover the model or those costs. A plan
    without a record costs as before the record: analytic on the device its model_spec names."""
    from graphpipe.cost.sources import costs_as_recorded

    device = args.device or (None if plan.cost_source else plan.model_spec.get("device"))
    costs, source, warning = costs_as_recorded(
        plan.cost_source, lambda: plan_graph(plan, args), cluster=plan_cluster(plan), costs_file=args.costs,
        device=device, label=f"plan {args.plan}", near=args.plan)
    if warning:
        print(f"graphpipe {command}: warning: {warning}", file=sys.stderr, flush=True)
    if source.kind == "file":
        check_costs_fit_plan(costs, plan, args.plan, str(source.path))
    return costs, source


def plan_cluster(plan: Plan) -> Cluster | None:
    """The cluster the plan was made for (None for a plan that records none: one made by hand)."""
    return Cluster.from_dict(plan.cluster) if plan.cluster else None


def plan_graph(plan: Plan, args: argparse.Namespace) -> OpGraph:
    """The op graph of the plan's model (command-line overrides applied), checked against the plan."""
    from graphpipe.cli.common import capture_from_args, check_plan_fits_graph, model_options

    spec = resolve_model_spec(plan, args.model, args.preset, args.batch, model_options(args))
    options = [f"{key}={json.dumps(value)}" for key, value in spec["options"].items()]  # parsed back as JSON
    namespace = argparse.Namespace(model=spec["model"], preset=spec["preset"], batch=spec.get("batch"),
                                   model_options=options, leaf_modules=spec.get("leaf_modules", []), seed=0,
                                   capture=plan.capture)  # the method that made the plan
    _, graph = capture_from_args(namespace)
    check_plan_fits_graph(plan, graph, args.plan)
    return graph


def check_costs_fit_plan(costs: CostTable, plan: Plan, plan_path: str, costs_path: str) -> None:
    """UsageError unless the cost table and the plan hold the same ops (one model, one capture)."""
    planned = [op for stage in plan.stages for op in stage.ops]
    unpriced = [op for op in planned if op not in costs.entries]
    unplanned = sorted(set(costs.entries) - set(planned))
    if not unpriced and not unplanned:
        return
    problem = (f"{costs_path} has no cost for {len(unpriced)} of the plan's {len(planned)} ops (e.g. {unpriced[:3]})"
               if unpriced else f"the plan leaves {len(unplanned)} ops of {costs_path} in no stage (e.g. "
                                f"{unplanned[:3]})")
    raise UsageError(f"plan {plan_path} (graph {plan.graph_name!r}) does not fit the costs: {problem}; profile "
                     "the model the plan was made from, or re-plan with these costs")


def resolve_model_spec(plan: Plan, model: str | None, preset: str | None, batch: int | None,
                       options: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's model spec with command-line overrides; falls back to parsing `graph_name`."""
    spec: dict[str, Any] = dict(plan.model_spec)
    if not spec.get("model") and not model:
        spec.update(_spec_from_graph_name(plan.graph_name))
    for key, value in (("model", model), ("preset", preset), ("batch", batch)):
        if value is not None:
            spec[key] = value
    spec["options"] = {**dict(spec.get("options") or {}), **dict(options)}
    spec.setdefault("preset", "tiny")
    if not spec.get("model"):
        raise ModelLoadError(f"plan {plan.graph_name!r} does not say which model it was made from; "
                             "pass --costs costs.json or --model NAME --preset PRESET")
    return spec


def _spec_from_graph_name(graph_name: str) -> dict[str, Any]:
    """"mmt-tiny" -> {"model": "mmt", "preset": "tiny"} for zoo models; {} otherwise."""
    from graphpipe.models import ZOO_NAMES

    name, _, preset = graph_name.rpartition("-")
    if name in ZOO_NAMES and preset:
        return {"model": name, "preset": preset}
    return {"model": graph_name} if graph_name in ZOO_NAMES else {}


# ---- text -----------------------------------------------------------------------------------
def render_result(plan: Plan, result: SimResult, source: CostSource) -> str:
    lines = [f"plan {plan.graph_name} ({plan.planner}): {plan.num_stages} stages, depth {plan.depth}, "
             f"{plan.world_size} devices, mini-batch {plan.global_batch_size}; {result.schedule} schedule, "
             f"{source}",
             f"iteration {result.iteration_time_s * 1e3:.3f} ms, {result.samples_per_s:,.1f} samples/s, "
             f"bubble {result.mean_bubble_fraction:.1%} mean / {result.max_bubble_fraction:.1%} max"]
    if plan.predicted_samples_per_s or plan.lower_bound_samples_per_s:
        lines.append(f"the planner predicted {plan.predicted_samples_per_s:,.1f} samples/s; the bound without "
                     f"bubbles or communication is {plan.lower_bound_samples_per_s:,.1f} samples/s")
    lines += ["", render_stage_table(plan, result), "", render_memory_table(result)]
    if plan.recompute_stages:
        lines.append("recomputing stages (" + ",".join(f"s{idx}" for idx in plan.recompute_stages) + "): each "
                     "backward runs the forward again; activations are the inputs of each micro-batch in flight "
                     "plus one micro-batch's")
    if result.critical_path:
        lines += ["", "critical path: " + _short_path(result.critical_path)]
    return "\n".join(lines)


def render_stage_table(plan: Plan, result: SimResult) -> str:
    """One row per stage; a `recompute` column when a stage recomputes its forward in its backward."""
    recompute = bool(plan.recompute_stages)
    rows: list[tuple[str, ...]] = [("stage", "ranks", "b", "micro-batches", "in-flight", "bubble")
                                   + (("recompute",) if recompute else ())]
    for stage in plan.stages:
        rows.append((f"s{stage.idx}", _ranks(stage.ranks), str(stage.micro_batch_size),
                     str(plan.num_micro_batches(stage.idx)), str(result.peak_in_flight_samples[stage.idx]),
                     f"{result.bubble_fraction[stage.idx]:.1%}")
                    + (("yes" if stage.recompute else "no",) if recompute else ()))
    return format_table(rows)


def render_memory_table(result: SimResult) -> str:
    rows: list[tuple[str, ...]] = [("rank", "peak", "static", "activations", "of device")]
    for rank, peak in enumerate(result.peak_memory_bytes):
        static = result.static_memory_bytes[rank]
        rows.append((str(rank), format_bytes(peak), format_bytes(static), format_bytes(peak - static),
                     f"{peak / result.device_memory_bytes:.0%}"))
    return format_table(rows)


def format_table(rows: list[tuple[str, ...]]) -> str:
    """Columns of numbers right-aligned, text left-aligned, a rule under the header."""
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    numeric = [all(_NUMBER.match(row[col]) for row in rows[1:]) for col in range(len(widths))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(cell.rjust(w) if num else cell.ljust(w)
                         for cell, w, num in zip(row, widths, numeric)).rstrip()

    out = [line(rows[0]), "  ".join("-" * w for w in widths)]
    return "\n".join(out + [line(row) for row in rows[1:]])


_NUMBER = re.compile(r"^(-|[\d.,\-]+( ?[%xkKMGTiB/s]+)?)$")


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _short_path(path: tuple[str, ...], keep: int = 8) -> str:
    steps = [a for a in path if ".SF" not in a and ".SB" not in a]
    if len(steps) <= 2 * keep:
        return " → ".join(steps)
    return " → ".join(steps[:keep]) + f" → … ({len(steps) - 2 * keep} more) → " + " → ".join(steps[-keep:])
