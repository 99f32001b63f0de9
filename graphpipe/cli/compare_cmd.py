"""`graphpipe compare`: graph pipeline plans against sequential ones, side by side, per device count.

For every model and device count, each planner plans the same graph with the same
analytic costs; every plan is then simulated on the cluster, so the throughputs are
comparable. Speedup is over the best sequential (chain-of-stages) plan of the row group.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, fields
from typing import Any

from graphpipe.cli.common import add_granularity_arg, print_json
from graphpipe.cli.plan_cmd import add_planner_limit_args, planner_limits
from graphpipe.cli.simulate_cmd import format_table
from graphpipe.errors import GraphPipeError
from graphpipe.schedule.generate import DEFAULT_SCHEDULE, SCHEDULE_NAMES
from graphpipe.units import format_bytes

DEFAULT_PLANNERS = ("graphpipe", "sequential", "pipedream", "piper")
# Planners whose stages form a linear pipeline (SPP), the baselines of the speedup column. Their
# stage graphs need not be chains: a linearised stage may still read from several earlier ones.
SEQUENTIAL_PLANNERS = frozenset({"sequential", "pipedream", "piper"})
REASON_WIDTH = 48


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One planner's outcome for one model and device count (`gave_up` set when it found no plan)."""

    model: str
    num_devices: int
    global_batch_size: int
    planner: str
    depth: int = 0
    micro_batch: str = ""
    samples_per_s: float = 0.0
    speedup: float = 0.0
    peak_memory_bytes: int = 0
    search_time_s: float = 0.0
    sequential: bool = False
    gave_up: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare planners (graphpipe, sequential, pipedream, piper) on a model",
        description="Plan a model with several planners for several device counts, simulate every plan, and "
                    "print one table per model: depth, micro-batch, predicted samples/s, speedup over the best "
                    "sequential plan, peak memory and search time.")
    parser.add_argument("--model", required=True, help="zoo model(s), comma separated, e.g. mmt,dlrm")
    parser.add_argument("--preset", default="tiny", help="model preset: tiny or paper (default tiny)")
    parser.add_argument("--set", dest="model_options", action="append", default=[], metavar="KEY=VALUE",
                        help="model option, e.g. --set num_branches=8 (repeatable)")
    parser.add_argument("--cluster", default="summit", help="cluster preset (default summit)")
    parser.add_argument("--devices", default="8", help="device counts, comma separated (default 8)")
    parser.add_argument("--mini-batch", "--batch", dest="batch", default=None,
                        help="mini-batch size, or one per device count (comma separated); default 4 per device")
    parser.add_argument("--planners", default=",".join(DEFAULT_PLANNERS),
                        help=f"planners, comma separated (default {','.join(DEFAULT_PLANNERS)})")
    parser.add_argument("--schedule", default=DEFAULT_SCHEDULE, choices=SCHEDULE_NAMES)
    add_granularity_arg(parser)
    add_planner_limit_args(parser)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    devices = _ints(args.devices, "--devices")
    batches = _batches(args.batch, devices)
    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    rows: list[Row] = []
    for model in [m.strip() for m in args.model.split(",") if m.strip()]:
        rows += compare_model(model, args, devices, batches, planners)
    if args.json:
        print_json({"cluster": args.cluster, "preset": args.preset, "rows": [row.to_dict() for row in rows]})
        return 0
    for model in dict.fromkeys(row.model for row in rows):
        print(f"{model} ({args.preset}) on {args.cluster}, {args.schedule} schedule")
        print(render_rows([row for row in rows if row.model == model]))
        print()
    return 0


def compare_model(model: str, args: argparse.Namespace, devices: list[int], batches: list[int],
                  planners: list[str]) -> list[Row]:
    from graphpipe.cli.common import capture_from_args
    from graphpipe.cost.cluster import Cluster
    from graphpipe.cost.sources import choose_costs

    namespace = argparse.Namespace(model=model, preset=args.preset, batch=None, model_options=args.model_options,
                                   leaf_modules=[], seed=0)
    _, graph = capture_from_args(namespace)
    rows: list[Row] = []
    costs = None
    for num_devices, batch in zip(devices, batches):
        cluster = Cluster.preset(args.cluster, num_devices)
        if costs is None:  # every count is the same cluster preset, so the same device
            costs, _ = choose_costs(graph, cluster=cluster)
        group = [_one(model, planner, graph, costs, cluster, batch, args.schedule, args.granularity,
                      planner_limits(args)) for planner in planners]
        rows += _with_speedups(group)
    return rows


def _one(model: str, planner: str, graph: Any, costs: Any, cluster: Any, batch: int, schedule: str,
         granularity: str = "op", limits: dict[str, Any] | None = None) -> Row:
    from graphpipe.cli.plan_progress import PlanProgressBar
    from graphpipe.planning import plan as make_plan
    from graphpipe.simulation.simulator import simulate

    base = {"model": model, "num_devices": cluster.num_devices, "global_batch_size": batch, "planner": planner}
    start = time.perf_counter()
    try:
        with PlanProgressBar(f"{planner} on {cluster.num_devices} devices") as progress:
            planned = make_plan(graph, costs, cluster, batch, planner=planner, granularity=granularity,
                                progress=progress, **(limits or {}))
        result = simulate(planned, costs, cluster, schedule=schedule)
    except GraphPipeError as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return Row(**base, search_time_s=time.perf_counter() - start, gave_up=reason)
    sizes = sorted({s.micro_batch_size for s in planned.stages})
    return Row(**base, depth=planned.depth, micro_batch="/".join(map(str, sizes)),
               samples_per_s=result.samples_per_s, peak_memory_bytes=max(result.peak_memory_bytes),
               search_time_s=planned.search_time_s or time.perf_counter() - start,
               sequential=planner in SEQUENTIAL_PLANNERS or planned.is_sequential)


def _with_speedups(group: list[Row]) -> list[Row]:
    best_seq = max((r.samples_per_s for r in group if r.sequential and not r.gave_up), default=0.0)
    if best_seq <= 0:
        return group
    return [r if r.gave_up else Row(**{**r.to_dict(), "speedup": r.samples_per_s / best_seq}) for r in group]


def render_rows(rows: list[Row]) -> str:
    table: list[tuple[str, ...]] = [("devices", "batch", "planner", "depth", "micro-batch", "samples/s",
                                     "speedup", "peak memory", "search s")]
    notes: list[str] = []
    for r in rows:
        if r.gave_up:
            reason = r.gave_up if len(r.gave_up) <= REASON_WIDTH else r.gave_up[:REASON_WIDTH - 1] + "…"
            table.append((str(r.num_devices), str(r.global_batch_size), r.planner, "-", "-", f"gave up: {reason}",
                          "-", "-", f"{r.search_time_s:.2f}"))
            note = r.gave_up if r.gave_up.startswith(f"{r.planner}:") else f"{r.planner}: {r.gave_up}"
            if reason != r.gave_up and note not in notes:
                notes.append(note)
            continue
        table.append((str(r.num_devices), str(r.global_batch_size), r.planner, str(r.depth), r.micro_batch,
                      f"{r.samples_per_s:,.1f}", f"{r.speedup:.2f}x" if r.speedup else "-",
                      format_bytes(r.peak_memory_bytes), f"{r.search_time_s:.2f}"))
    return "\n".join([format_table(table), *(f"  {note}" for note in notes)])


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(tok) for tok in text.split(",") if tok.strip()]
    except ValueError:
        raise GraphPipeError(f"{flag} {text!r}: give whole numbers separated by commas, e.g. 8,16,32") from None
    if not values or min(values) < 1:
        raise GraphPipeError(f"{flag} {text!r}: give positive whole numbers, e.g. 8,16,32")
    return values


def _batches(text: str | None, devices: list[int]) -> list[int]:
    if text is None:
        return [4 * n for n in devices]
    values = _ints(text, "--batch")
    if len(values) == 1:
        return values * len(devices)
    if len(values) != len(devices):
        raise GraphPipeError(f"--batch has {len(values)} values for {len(devices)} device counts; give one, "
                             "or one per device count")
    return values
