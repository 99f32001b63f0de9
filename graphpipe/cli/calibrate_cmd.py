"""`graphpipe calibrate`: measure this host once, so that `local-cpu` plans and simulations are of this machine.

What it measures and how it is used: `graphpipe.cost.host_cache` (where it is kept, when it is read),
`graphpipe.cost.host_calibration` (the runtime's overheads and the slowdown of workers computing at once),
`graphpipe.runtime.loopback` (the gloo links).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphpipe.cli.common import add_model_args, capture_from_args, model_options, positive_int, print_json
from graphpipe.errors import CostError

if TYPE_CHECKING:
    from graphpipe.cost.cluster import Device
    from graphpipe.cost.cost_table import CostTable
    from graphpipe.cost.host_calibration import HostCalibration, SizeTiming

NOISY_SPREAD = 0.25  # above this, the iterations a calibration timed were disturbed: it says so
# The reference model when none is named: mmt's tiny preset widened so that its ops' compute, not the per-kernel
# overhead alone, is what the fit sees (as `benchmarks/sim_ranking` does), at micro-batches 1-16.
REFERENCE = {"num_branches": 3, "num_layers": 2, "hidden": 96, "ffn_hidden": 384, "seq_len": 32}
REFERENCE_BATCH = 16


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="measure this host for the local-cpu cluster (kept, and used by plan, simulate, train)",
        description="Profile a reference model's ops on one thread, fit the cpu device's analytic model to them, "
                    "train it on --workers processes at once (as a pipeline and data parallel) to measure the "
                    "runtime's overheads, the slowdown of workers computing together and the all-reduce as "
                    "replicas meet it, and measure gloo's point-to-point and all-reduce over loopback. The result "
                    "is kept for this host; from then on the local-cpu cluster is this machine, and `graphpipe "
                    "train` prints the simulated iteration beside the measured one. "
                    "Run it on a quiet machine (about a minute). Without --model: mmt widened to "
                    f"{', '.join(f'{k}={v}' for k, v in REFERENCE.items())}, example batch {REFERENCE_BATCH}.")
    add_model_args(parser, default_model="mmt")
    parser.set_defaults(batch=None)
    parser.add_argument("--workers", type=positive_int, default=2,
                        help="worker processes that train at once (default 2: the ranks of a two-stage plan)")
    parser.add_argument("--steps", type=positive_int, default=24,
                        help="timed iterations per micro-batch size (default 24; the sizes take turns)")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="where to keep it (default: the host cache, `graphpipe calibrate --show` names it)")
    parser.add_argument("--keep-noisy", action="store_true",
                        help=f"keep a calibration whose timed iterations spread more than {NOISY_SPREAD:.0%} "
                             "(by default nothing is kept then: it could not predict this host within that)")
    parser.add_argument("--show", action="store_true", help="print the kept calibration; measure nothing")
    parser.add_argument("--remove", action="store_true", help="forget the kept calibration (local-cpu is the "
                                                              "cpu preset again)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphpipe.cost.host_cache import cache_path, load_host

    path = Path(args.output) if args.output else cache_path()
    if args.remove:
        path.unlink(missing_ok=True)
        print(f"removed {path}: local-cpu is the cpu preset again")
        return 0
    if args.show:
        host = load_host(path)
        if host is None:
            print(f"no calibration of this host at {path}: local-cpu is the cpu preset (run `graphpipe calibrate`)")
            return 0
        _report(host.to_dict(), path, args.json)
        return 0
    data = measure(args)
    _report(data, path, args.json)
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Measure and keep this host's calibration; its JSON form."""
    from graphpipe.cli.profile_cmd import powers_of_two_up_to
    from graphpipe.cost.calibrate import fit_device
    from graphpipe.cost.host_cache import CachedHost, save_host
    from graphpipe.cost.profile import profile
    from graphpipe.cost.training_collective import collective_in_training
    from graphpipe.runtime.host_timing import measure_adam_streaming
    from graphpipe.runtime.loopback import measure_all_reduce, measure_link

    if args.model == "mmt" and not args.model_options:
        args.model_options = [f"{key}={value}" for key, value in REFERENCE.items()]
        args.batch = args.batch or REFERENCE_BATCH
    zoo, graph = capture_from_args(args, device="cpu")
    sizes = powers_of_two_up_to(graph.example_batch_size)
    _say(args, f"profiling {graph.name}'s ops on one thread at micro-batches {', '.join(map(str, sizes))}")
    table = profile(graph, zoo.model, sizes, example_inputs=zoo.inputs, num_threads=1, progress=False)
    fit = fit_device(graph, table)
    _say(args, "timing Adam's step")
    step_bandwidth = measure_adam_streaming()
    hosts, replicas = _fit_hosts(args, table, fit.device, (sizes, graph.example_batch_size), step_bandwidth)
    host, single = hosts[args.workers], hosts[1]
    _say(args, "measuring gloo over loopback")
    link, alone = measure_link(), measure_all_reduce()
    grad_bytes = sum(table.at(op, sizes[0]).param_bytes for op in table.entries)
    collective = collective_in_training(replicas, grad_bytes, alone) if replicas else alone
    details = {"model": args.model, "preset": args.preset, "options": model_options(args),
               "micro_batch_sizes": list(sizes), "profile_spread": table.spread, "device_fit": str(fit),
               "device_fit_median_error": fit.median_rel_error, "host": host.to_dict(),
               "host_single": single.to_dict(), "all_reduce_alone": alone.to_dict()}
    cached = CachedHost(device=host.device(fit.device), single_device=single.device(fit.device), link=link,
                        collective=collective, details=details)
    spread = max(host.iteration_spread, single.iteration_spread)
    if spread > NOISY_SPREAD and not args.keep_noisy:
        raise CostError(f"the timed iterations spread {spread:.0%} (above {NOISY_SPREAD:.0%}): other processes were "
                        "using the CPU, or this host's timings move that much, and a calibration from them would not "
                        "predict it within that; nothing kept (local-cpu stays as it was). Calibrate on a quiet "
                        "machine, or keep it anyway with --keep-noisy")
    save_host(cached, Path(args.output) if args.output else None)
    return cached.to_dict()


def _fit_hosts(args: argparse.Namespace, table: CostTable, device: Device, batches: tuple[tuple[int, ...], int],
               step_bandwidth: float) -> tuple[dict[int, HostCalibration], list[list[SizeTiming]]]:
    """The host fitted on one worker and on `--workers` (a pipeline and data parallel), and the replicas'
    timings. `batches`: the micro-batch sizes and the example batch."""
    from graphpipe.cost.host_calibration import fit_host
    from graphpipe.runtime.host_timing import measure_runtime

    hosts: dict[int, HostCalibration] = {}
    replicas: list[list[SizeTiming]] = []
    sizes, batch = batches
    spec = (args.model, args.preset, model_options(args), batch)
    for workers in (1, args.workers):
        _say(args, f"training it on {workers} process{'es as a pipeline and data parallel' if workers > 1 else ''}")
        timings = measure_runtime(*spec, sizes, workers=workers, steps=args.steps)
        if workers > 1:  # a plan on several workers pipelines, replicates, or both: fit one host to both
            replicas = measure_runtime(*spec, sizes, workers=workers, steps=args.steps, data_parallel=True)
            timings = [chain + replica for chain, replica in zip(timings, replicas)]
        hosts[workers] = fit_host(timings, table, device, step_bandwidth, alone=hosts.get(1))
    return hosts, replicas


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(f"graphpipe calibrate: {text}", file=sys.stderr, flush=True)


def _report(data: dict[str, Any], path: Path, as_json: bool) -> None:
    from graphpipe.cost.host_calibration import HostCalibration

    if as_json:
        print_json({**data, "path": str(path)})
        return
    link, collective, details = data["link"], data["collective"], data["details"]
    host = details["host"]
    print(f"this host ({data['machine']['host']}, {data['machine']['cpus']} cores, torch {data['machine']['torch']}), "
          f"kept in {path}:")
    print(f"  ops: {details['device_fit']}")
    for label, fitted in ((f"{host['workers']} workers (a pipeline, data parallel)", host), ("one worker alone",
                                                                             details["host_single"])):
        calls = HostCalibration(**fitted).call_scales
        print(f"  {label}: ops' per-sample time x{fitted['compute_scale']:.2f}, per-call time x{calls[0]:.2f} "
              f"forward, x{calls[1]:.2f} backward; per forward action "
              f"+{fitted['fwd_action_overhead_us']:.0f} us, per backward +{fitted['bwd_action_overhead_us']:.0f} us, "
              f"per optimizer step +{fitted['step_overhead_us']:.0f} us (fit error {fitted['median_rel_error']:.0%})")
    print(f"  Adam streams its state at {host.get('step_bandwidth_gb_per_s', 0):.2f} GB/s")
    print(f"  gloo point-to-point: {link['latency_us']:.0f} us, {link['bandwidth_gb_per_s']:.2f} GB/s; all-reduce "
          f"in training as a ring on {collective['latency_us']:.0f} us, {collective['bandwidth_gb_per_s']:.2f} GB/s"
          + (f" (on its own {alone['latency_us']:.0f} us: the replicas wait for each other)"
             if (alone := details.get("all_reduce_alone")) and alone["latency_us"] < collective["latency_us"] else ""))
    spread = max(host["iteration_spread"], details["host_single"]["iteration_spread"])
    if spread > NOISY_SPREAD:
        print(f"warning: the timed iterations spread {spread:.0%} (above {NOISY_SPREAD:.0%}): "
              "other processes were using the CPU; calibrate again on a quiet machine", file=sys.stderr)
