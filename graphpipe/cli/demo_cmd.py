"""`graphpipe demo`: the whole story on this machine in seconds: capture, cost, plan, simulate, draw.

A tiny zoo model (mmt: 4 branches by default) is captured, costed with the analytic model
of this machine's CPU workers, planned by graphpipe and by the sequential baseline for the
`local-cpu` cluster, and both plans are simulated side by side. Where graphpipe gains less than 2%
there (this machine's workers share its cores), one line says why, and the same comparison follows
on a described cluster with a device per stage. The pictures (stage graphs, Gantt charts, a Chrome
trace) and the plans go to `out/`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphpipe.cli.capture_cmd import flops_per_sample, render_summary
from graphpipe.cli.common import add_model_args, capture_from_args, positive_int, print_json
from graphpipe.cli.plan_cmd import parse_sizes
from graphpipe.cli.simulate_cmd import format_table
from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.summary import summarize
from graphpipe.units import format_bytes

if TYPE_CHECKING:
    from graphpipe.simulation.result import SimResult
    from graphpipe.stages.stage_graph import Plan

PLANNERS = ("graphpipe", "sequential")
NO_GAIN = 1.02  # below this ratio of simulated throughputs the demo says why graph pipelining did not pay
DESCRIBED = (8, "summit")  # where it does: 8 V100s, a device per stage


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="plan a tiny model for this machine's workers: graphpipe vs sequential, with pictures",
        description="Capture a tiny zoo model, cost it, plan it with graphpipe and with the sequential "
                    "baseline for this machine's CPU workers, simulate both side by side, and write the "
                    "stage graphs, Gantt charts and a trace to --out.")
    add_model_args(parser, default_model="mmt")
    parser.add_argument("--cluster", default="local-cpu", help="cluster preset (default local-cpu)")
    parser.add_argument("--devices", type=positive_int, default=4, help="workers to plan for (default 4)")
    parser.add_argument("--mini-batch", type=positive_int, default=64, help="samples per iteration (default 64)")
    parser.add_argument("--micro-batch-sizes", default=None, metavar="B1,B2,...",
                        help="micro-batch sizes the planners may use (default: powers of two up to an eighth of "
                             "the mini-batch, so that the pipeline has at least 8 micro-batches to overlap)")
    parser.add_argument("--device", default=None, help="device preset for the analytic costs (default: the "
                                                       "cluster's)")
    parser.add_argument("--out", default="out", help="folder for pictures and plans (default out/)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphpipe.cost.cluster import Cluster
    from graphpipe.cost.sources import choose_costs

    parse_sizes(args.micro_batch_sizes, args.mini_batch)  # bad sizes said now, not after capturing
    _, graph = capture_from_args(args)
    summary = summarize(graph)
    cluster = Cluster.preset(args.cluster, args.devices)
    costs, source = choose_costs(graph, device=args.device, cluster=cluster)
    outcomes = {name: _plan_and_simulate(name, graph, costs, source, cluster, args) for name in PLANNERS}
    written = _write_outputs(outcomes, Path(args.out), graph)
    if args.json:
        why = why_no_gain(outcomes, cluster)
        described = {name: _outcome_dict(o) for name, o in _described_outcomes(graph, args).items()} \
            if _shows_described(why, args) else {}
        print_json({"why_no_gain": why, "described_cluster": described, "summary": summary.to_dict(),
                    "fwd_flops_per_sample": flops_per_sample(graph),
                    "analytic": analytic_totals(graph, costs), "cluster": cluster.to_dict(),
                    "mini_batch": args.mini_batch, "micro_batch_sizes": micro_batch_sizes(args),
                    "plans": {name: _outcome_dict(o) for name, o in outcomes.items()}, "written": written})
        return 0
    print(f"1. capture: {args.model} ({args.preset}) traced with torch.fx\n")
    print(render_summary(summary, flops_per_sample(graph)))
    totals = analytic_totals(graph, costs)
    print(f"\n2. cost: {costs.source} model of {costs.device}, one batch of {graph.example_batch_size}: "
          f"forward {totals['fwd_ms']:.3f} ms, backward {totals['bwd_ms']:.3f} ms; cluster {cluster}")
    sizes = ",".join(map(str, micro_batch_sizes(args)))
    print(f"\n3. plan a mini-batch of {args.mini_batch} (micro-batch sizes {sizes}) with each planner, "
          "simulate, side by side:\n")
    print(render_side_by_side(outcomes))
    why = why_no_gain(outcomes, cluster)
    if why:
        print(f"\n{why}")
    if _shows_described(why, args):
        described = _described_outcomes(graph, args)
        print(f"\n   the same model and mini-batch on {DESCRIBED[0]} devices of the `{DESCRIBED[1]}` preset "
              "(analytic costs), a device per stage:\n")
        print(render_side_by_side(described))
    print("\n4. pictures and plans:")
    for path in written:
        print(f"   {path}")
    first = Path(args.out) / "plan_graphpipe.json"
    print("\nnext:")
    print(f"   graphpipe simulate {first} --gantt gantt.png --trace trace.json")
    print(f"   graphpipe train --model {args.model} --preset {args.preset} --nproc {args.devices} "
          f"--plan {first} --steps 20")
    return 0


def _plan_and_simulate(planner: str, graph: Any, costs: Any, source: Any, cluster: Any,
                       args: argparse.Namespace) -> dict[str, Any]:
    from graphpipe.cli.plan_progress import PlanProgressBar
    from graphpipe.cli.simulate_cmd import model_spec_from_args
    from graphpipe.errors import GraphPipeError
    from graphpipe.planning import plan as make_plan
    from graphpipe.simulation.simulator import simulate

    start = time.perf_counter()
    try:
        with PlanProgressBar(planner) as progress:
            planned = make_plan(graph, costs, cluster, args.mini_batch, planner=planner,
                                micro_batch_sizes=micro_batch_sizes(args), cost_source=source, progress=progress)
    except GraphPipeError as err:
        return {"planner": planner, "error": str(err).splitlines()[0]}
    planned = type(planned).from_dict({**planned.to_dict(),
                                       "model_spec": model_spec_from_args(args, costs.device)})
    result = simulate(planned, costs, cluster, schedule=planned.schedule)
    return {"planner": planner, "plan": planned, "result": result, "wall_s": time.perf_counter() - start}


def why_no_gain(outcomes: dict[str, dict[str, Any]], cluster: Any) -> str | None:
    """One line on why graphpipe gains less than 2% over the chain here, or None where it gains more."""
    if any("result" not in outcome for outcome in outcomes.values()):
        return None
    graph_plan, chain = (outcomes[name] for name in PLANNERS)
    if graph_plan["result"].samples_per_s >= NO_GAIN * chain["result"].samples_per_s:
        return None
    cores = cluster.cores_per_node
    if not graph_plan["plan"].is_sequential and cores is not None and cores < cluster.devices_per_node:
        return (f"why no gain: the {cluster.devices_per_node} workers share {cores} cores, so at most {cores} "
                "stages compute at once, and the branch stages graphpipe runs side by side wait for a core "
                "(the simulator's model of this machine); with a device per stage it pays.")
    return ("why no gain: graphpipe's best plan is a chain too (the model's branches gain nothing at this "
            "mini-batch and device count); with a device per stage they may.")


def _shows_described(why: str | None, args: argparse.Namespace) -> bool:
    """Whether the demo adds the described cluster's comparison: graph pipelining did not pay here, and here
    is not already that cluster."""
    return why is not None and (args.cluster, args.devices) != (DESCRIBED[1], DESCRIBED[0])


def _described_outcomes(graph: OpGraph, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Both planners on the described cluster `DESCRIBED`, simulated (no pictures)."""
    from graphpipe.cost.cluster import Cluster
    from graphpipe.cost.sources import choose_costs

    devices, name = DESCRIBED
    cluster = Cluster.preset(name, devices)
    costs, source = choose_costs(graph, cluster=cluster)
    return {planner: _plan_and_simulate(planner, graph, costs, source, cluster, args) for planner in PLANNERS}


def micro_batch_sizes(args: argparse.Namespace) -> list[int]:
    if args.micro_batch_sizes:
        return list(parse_sizes(args.micro_batch_sizes, args.mini_batch) or ())
    sizes = [1]
    while sizes[-1] * 2 <= max(1, args.mini_batch // 8):
        sizes.append(sizes[-1] * 2)
    return sizes


def render_side_by_side(outcomes: dict[str, dict[str, Any]]) -> str:
    names = list(outcomes)
    rows: list[tuple[str, ...]] = [("", *names)]
    metrics: list[tuple[str, Callable[[Plan, SimResult], str]]] = [
        ("stages", lambda p, r: str(p.num_stages)), ("depth", lambda p, r: str(p.depth)),
               ("micro-batch", lambda p, r: "/".join(str(b) for b in sorted({s.micro_batch_size for s in p.stages}))),
               ("first stage in-flight", lambda p, r: str(r.peak_in_flight_samples[0])),
               ("iteration ms", lambda p, r: f"{r.iteration_time_s * 1e3:.2f}"),
               ("samples/s", lambda p, r: f"{r.samples_per_s:,.1f}"),
               ("bubble (mean)", lambda p, r: f"{r.mean_bubble_fraction:.1%}"),
               ("peak memory", lambda p, r: format_bytes(max(r.peak_memory_bytes))),
               ("search s", lambda p, r: f"{p.search_time_s:.2f}")]
    for label, cell in metrics:
        rows.append((label, *(cell(o["plan"], o["result"]) if "plan" in o else "-" for o in outcomes.values())))
    table = format_table(rows)
    done = {n: o for n, o in outcomes.items() if "result" in o}
    if len(done) == 2:
        a, b = (done[n]["result"].samples_per_s for n in names)
        table += f"\n\n{names[0]} runs {a / b:.2f}x the throughput of {names[1]} (simulated)."
    for name, o in outcomes.items():
        if "error" in o:
            table += f"\n{name} gave up: {o['error']}"
    return table


def _write_outputs(outcomes: dict[str, dict[str, Any]], out: Path, graph: OpGraph) -> list[str]:
    from graphpipe.simulation.gantt import render_gantt
    from graphpipe.simulation.stage_picture import render_stage_graph
    from graphpipe.simulation.trace import write_chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    done = {name: o for name, o in outcomes.items() if "plan" in o}
    longest_ms = max((o["result"].iteration_time_s * 1e3 for o in done.values()), default=None)
    written: list[str] = []
    for name, o in done.items():
        plan_path = out / f"plan_{name}.json"
        o["plan"].save(str(plan_path))
        title = f"{o['plan'].graph_name} · {name} plan (same time axis for every planner)"
        written += [str(plan_path), render_stage_graph(o["plan"], out / f"stages_{name}.png", graph=graph),
                    render_gantt(o["result"], out / f"gantt_{name}.png", title=title, time_limit_ms=longest_ms),
                    write_chrome_trace(o["result"], out / f"trace_{name}.json")]
    return written


def _outcome_dict(o: dict[str, Any]) -> dict[str, Any]:
    if "error" in o:
        return {"gave_up": o["error"]}
    return {"plan": o["plan"].to_dict(), "simulation": o["result"].summary()}


def analytic_totals(graph: OpGraph, costs: CostTable) -> dict[str, float]:
    """Whole-model forward and backward time of one example batch."""
    batch = graph.example_batch_size
    return {"fwd_ms": sum(costs.at(op.name, batch).fwd_ms for op in graph.ops),
            "bwd_ms": sum(costs.at(op.name, batch).bwd_ms for op in graph.ops)}
