"""`graphpipe capture`: trace a model into an op graph, summarise it, optionally save it as JSON."""

from __future__ import annotations

import argparse
from typing import Any

from graphpipe.cli.common import (
    add_model_args,
    capture_from_args,
    check_output_files,
    format_count,
    print_json,
    writing,
)
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.summary import GraphSummary, summarize
from graphpipe.units import format_bytes


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("capture", help="trace a model into an op graph and summarise it",
                                   description="Trace a model with torch.fx into an operator graph (JSON) and "
                                               "print its ops, parameters, FLOPs, activations and branches.")
    add_model_args(parser)
    parser.add_argument("-o", "--output", default=None, metavar="GRAPH.json", help="write the op graph here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output_files(("-o", args.output, "graph.json"))
    _, graph = capture_from_args(args)
    if args.output:
        with writing("-o", args.output):
            graph.save(args.output)
    summary = summarize(graph)
    flops = flops_per_sample(graph)
    if args.json:
        print_json(summary_dict(summary, flops, args.output))
    else:
        print(render_summary(summary, flops))
        if args.output:
            print(f"wrote {args.output}")
    return 0


def flops_per_sample(graph: OpGraph) -> float | None:
    """Forward FLOPs per sample from the analytic cost model, or None where it is not available."""
    try:
        from graphpipe.cost.flops import op_flops
    except ImportError:
        return None
    return sum(op_flops(op) for op in graph.ops) / graph.example_batch_size


def summary_dict(summary: GraphSummary, flops: float | None, output: str | None = None) -> dict[str, Any]:
    data = summary.to_dict()
    data["fwd_flops_per_sample"] = flops
    if output:
        data["output"] = output
    return data


CAPTURED_WITH = {"fx": "torch.fx", "export": "torch.export (dynamic batch)",
                 "export-static": "torch.export at one sample (the forward fixes the batch size; every stage runs "
                                  "its share sample by sample)"}


def render_summary(summary: GraphSummary, flops: float | None) -> str:
    lines = [
        f"graph {summary.name}: {summary.num_ops} ops, example batch {summary.example_batch_size}, captured with "
        f"{CAPTURED_WITH.get(summary.capture, summary.capture)}",
        f"parameters:  {format_count(summary.num_params)} ({format_bytes(summary.param_bytes)})"
        + (f", buffers {format_bytes(summary.buffer_bytes)}" if summary.buffer_bytes else ""),
    ]
    if flops is not None:
        lines.append(f"forward FLOPs per sample:  {format_count(flops, 'FLOP')}")
    lines.append(f"activations per sample:  {format_bytes(summary.act_bytes_per_sample)} "
                 f"(op outputs, views included); inputs {format_bytes(summary.input_bytes_per_sample)}")
    lines.append(render_branches(summary))
    lines.append(render_block(summary))
    lines.append(render_granularity(summary))
    lines.append("ops by type:")
    width = max((len(name) for name, _ in summary.ops_by_type), default=0)
    lines.extend(f"  {name:<{width}}  {count:>6}" for name, count in summary.ops_by_type)
    return "\n".join(lines)


MAX_REGIONS_SHOWN = 5


def render_block(summary: GraphSummary) -> str:
    """How much of the model must share one stage: near 100% means graph pipelining cannot split it."""
    total = max(summary.num_compute_ops, 1)
    share = summary.largest_block_ops / total
    text = (f"largest block:  {summary.largest_block_ops} of {summary.num_compute_ops} computing ops "
            f"({share:.0%}) must share one stage")
    if share > 0.5:
        text += " (a shared weight, a value that cannot be sent, or a non-SP region ties them)"
    return text


def render_granularity(summary: GraphSummary) -> str:
    """How many units the planner cuts between at op and at layer granularity (`--granularity` of plan)."""
    text = f"granularity:  op {summary.num_op_units} units, layer {summary.num_layer_units} units"
    if not summary.layer_blocks:
        return text + " (no repeated module to keep whole)"
    blocks = ", ".join(f"{count} x {name.rpartition('.')[2]}" for name, count in summary.layer_blocks)
    return f"{text} ({blocks} kept whole)"


def render_branches(summary: GraphSummary) -> str:
    if not summary.branches:
        return "branches:  none (one chain of ops)"
    parts = []
    shown = sorted(summary.branches, key=lambda r: -sum(len(chain) for chain in r.chains))[:MAX_REGIONS_SHOWN]
    for region in shown:
        fork = repr(region.fork) if region.fork else "the inputs"
        join = repr(region.join) if region.join else "the output"
        lengths = sorted({len(chain) for chain in region.chains})
        sizes = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
        parts.append(f"  {region.num_branches} parallel chains between {fork} and {join} ({sizes} ops each)")
    if len(summary.branches) > len(shown):
        parts.append(f"  ... and {len(summary.branches) - len(shown)} smaller regions (--json lists them all)")
    return f"branches:  up to {summary.max_branches} in parallel\n" + "\n".join(parts)
