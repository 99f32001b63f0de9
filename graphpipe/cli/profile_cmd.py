"""`graphpipe profile`: measure (or model) every op's cost per micro-batch size and save the table."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from graphpipe.cli.common import add_model_args, capture_from_args, positive_int, print_json
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.summary import CostSummary, summarize_costs
from graphpipe.errors import CostError
from graphpipe.units import format_bytes

NOISY_SPREAD = 0.10  # above this, `profile` warns: on a quiet machine the spread is a few percent


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "profile", help="cost every op per micro-batch size (measured, or analytic with --analytic)",
        description="Time each op's forward and backward in isolation for each micro-batch size, scaled to sum to "
                    "the whole model's pass (or, with --analytic DEVICE, estimate them from FLOPs and bytes) and "
                    "save the cost table as JSON.")
    add_model_args(parser)
    parser.add_argument("--micro-batch-sizes", type=size_list, default=None, metavar="1,2,4",
                        help="micro-batch sizes to cost (default: powers of two up to the example batch; "
                             "analytic: up to 512)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to measure (default cpu)")
    parser.add_argument("--analytic", default=None, metavar="DEVICE",
                        help="no measuring: the analytic model on a device preset (v100-16gb, a100-80gb, cpu, ...)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch CPU threads while measuring (default 1: one worker process's view)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per op (default 2)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per op; the median is kept")
    parser.add_argument("--ops-alone", action="store_true",
                        help="keep each op's time alone; by default each size's op times are scaled to sum to the "
                             "whole model's forward and backward, as a stage runs them")
    parser.add_argument("--calibrate", action="store_true",
                        help="also fit a device to the measured table (for the analytic model) and print it")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("-o", "--output", default=None, metavar="COSTS.json", help="write the cost table here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def size_list(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"micro-batch sizes must be >= 1, got {text!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {}
    if args.analytic:
        from graphpipe.cost.sources import choose_costs

        _, graph = capture_from_args(args)
        table, _ = choose_costs(graph, device=args.analytic, micro_batch_sizes=args.micro_batch_sizes)
    else:
        from graphpipe.cost.profile import profile

        zoo, graph = capture_from_args(args, device="cpu")
        sizes = args.micro_batch_sizes or powers_of_two_up_to(graph.example_batch_size)
        table = profile(graph, zoo.model, sizes, example_inputs=zoo.inputs, device=args.device,
                        warmup=args.warmup, repeats=args.repeats, leaf_modules=args.leaf_modules,
                        progress=not args.no_progress, num_threads=args.threads if args.device == "cpu" else None,
                        whole_pass=not args.ops_alone)
        # on CUDA each op is timed between two CUDA events (its kernels), on the CPU by the host's clock
        extra["timed_by"] = "CUDA events" if args.device == "cuda" else "host clock"
        extra["op_times"] = "each op alone" if args.ops_alone else "scaled to sum to the model's pass"
        if args.calibrate:
            from graphpipe.cost.calibrate import fit_device

            fit = fit_device(graph, table)
            extra["calibrated_device"] = {**fit.device.to_dict(), "median_rel_error": fit.median_rel_error,
                                          "total_rel_error": fit.total_rel_error, "num_entries": fit.num_entries}
            extra["calibration"] = str(fit)
    if args.output:
        table.save(args.output)
    summary = summarize_costs(table)
    if table.spread is not None and table.spread > NOISY_SPREAD:
        print(f"graphpipe profile: warning: the measurements are noisy: the timed runs of an op spread "
              f"{table.spread:.0%} around their median (above {NOISY_SPREAD:.0%}); other processes were probably "
              "using the CPU: profile on a quiet machine, or with more --repeats", file=sys.stderr)
    if args.json:
        print_json({**summary.to_dict(), "graph": graph.name, **({"output": args.output} if args.output else {}),
                    **({"spread": table.spread} if table.spread is not None else {}),
                    **{key: value for key, value in extra.items() if key != "calibration"}})
        return 0
    print(render(summary, table, graph.name))
    if table.spread is not None:
        print(f"measurement spread: {table.spread:.1%} (interquartile range of each op's timed runs, summed over "
              "ops, over the sum of their medians; the largest over the micro-batch sizes)")
    if "op_times" in extra:
        print(f"op times: {extra['op_times']}")
    if "calibration" in extra:
        print(f"calibrated device: {extra['calibration']}")
    if args.output:
        print(f"wrote {args.output}")
    return 0


def powers_of_two_up_to(limit: int) -> tuple[int, ...]:
    if limit < 1:
        raise CostError(f"example batch must be >= 1, got {limit}")
    sizes = [1]
    while sizes[-1] * 2 <= limit:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def render(summary: CostSummary, table: CostTable, graph_name: str) -> str:
    lines = [f"costs of {graph_name} ({summary.source} on {summary.device}): {summary.num_ops} ops, "
             f"{summary.num_costed_ops} take time; parameters {format_bytes(summary.param_bytes)}",
             f"  {'micro-batch':>11}  {'fwd ms':>10}  {'bwd ms':>10}  {'ms/sample':>10}  {'activations':>12}"]
    lines.extend(f"  {t.micro_batch_size:>11}  {t.fwd_ms:>10.3f}  {t.bwd_ms:>10.3f}  {t.ms_per_sample:>10.4f}  "
                 f"{format_bytes(t.act_bytes):>12}" for t in summary.totals)
    if summary.top_ops:
        largest = table.micro_batch_sizes[-1]
        lines.append(f"costliest ops at micro-batch {largest} (fwd + bwd):")
        width = max(len(share.name) for share in summary.top_ops)
        lines.extend(f"  {share.name:<{width}}  {share.ms:>10.3f} ms  {share.fraction:>6.1%}"
                     for share in summary.top_ops)
    return "\n".join(lines)
