"""Throughput of graphpipe against torch.distributed.pipelining on the same chain, ranks sharing the GPU(s).

    python benchmarks/gpu/vs_torch.py --device cuda --ranks 4          # `make gpu-check` on a GPU
    python benchmarks/gpu/vs_torch.py --device cpu --ranks 2 --rounds 2 --iters 2   # its CPU rehearsal

Cuts mmt (options in --options, JSON) into a chain of `--ranks` one-rank stages of about equal analytic cost,
at `--ranks` micro-batches, so that both runtimes get the same split, the same micro-batch size and the same
schedule (1F1B: graphpipe's "1f1b", torch's Schedule1F1B) with Adam. Then
`--ranks` processes on one gloo group (rank i on cuda:(i % GPUs), or the CPU) run both, interleaved round by
round so that machine noise hits each alike: graphpipe's `PipelineTrainer` (host-staged transport) and torch
pipelining's `PipelineStage` on the same stages (`benchmarks/runtime/bench_runtime.pipelining_stage`), its
sends and receives staged through host memory the same way (`staged_p2p.py`: gloo cannot move GPU
memory). Each round times `--iters` steps between barriers (on CUDA after a synchronisation). Prints one
JSON object: samples/s per runtime (median, min, max over rounds) and graphpipe's ratio.

What it measures on one GPU: both runtimes with the same handicap (every message through the host), so the
ratio compares their scheduling and per-action overheads on real kernels, not NCCL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import operator
import os
import statistics
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "benchmarks" / "runtime"), str(HERE.parents[1])]

from graphpipe.runtime.spawn_ranks import run_ranks  # noqa: E402


def chain_plan(options: dict[str, Any], batch: int, ranks: int) -> Any:
    """mmt cut into `ranks` stages of one rank each, in the graph's topological order, at about equal analytic
    forward cost, `ranks` micro-batches: a chain both runtimes can run (torch pipelining carries the values
    that skip a stage through the stages between; graphpipe sends them directly)."""
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.cost.cluster import Cluster
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model
    from tests.runtime.helpers import plan_from

    zoo = load_model("mmt", "tiny", batch_size=batch, seed=0, **options)
    size = batch // ranks
    costs = analytic_costs(capture(zoo.model, zoo.inputs), Cluster.preset("local-cpu", 1).device,
                           micro_batch_sizes=[size])
    weights = {name: entry[size].fwd_ms + entry[size].bwd_ms for name, entry in costs.entries.items()}
    total = sum(weights.values()) or 1.0
    done = 0.0

    def stage_of(node: Any) -> int | None:
        nonlocal done
        if node.target is operator.getitem:  # an element of a tuple stays with the op that made the tuple
            return None
        stage = min(int(done / total * ranks), ranks - 1)
        done += weights.get(node.name, 0.0)
        return stage

    planned = plan_from(zoo.model, stage_of, [(rank,) for rank in range(ranks)], micro_batch_size=size,
                        global_batch_size=batch)
    if planned.num_stages != ranks:
        raise SystemExit(f"vs_torch: mmt did not split into {ranks} stages: {planned}")
    return with_1f1b_in_flight(planned)


def with_1f1b_in_flight(planned: Any) -> Any:
    """The plan with the samples each stage keeps in flight that 1F1B needs (`graphpipe.stages.in_flight`, as the
    planners set them; a hand-made plan keeps one micro-batch, which would run the chain without overlap)."""
    from graphpipe.stages.in_flight import in_flight_samples

    successors: dict[int, list[int]] = {stage.idx: [] for stage in planned.stages}
    for edge in planned.edges:
        successors[edge.src].append(edge.dst)
    counts = in_flight_samples(successors, {stage.idx: stage.micro_batch_size for stage in planned.stages},
                               planned.global_batch_size)
    stages = tuple(dataclasses.replace(stage, in_flight_samples=counts[stage.idx]) for stage in planned.stages)
    return dataclasses.replace(planned, stages=stages)


def _rank(rank: int, world: int, port: int, plan_data: dict[str, Any], options: dict[str, Any], batch: int,
          device_name: str, rounds: int, iters: int, out: Any) -> None:
    try:
        torch.set_num_threads(1)
        device = torch.device("cpu") if device_name == "cpu" else torch.device("cuda", rank % torch.cuda.device_count())
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=300))
        runners = make_runners(rank, world, plan_data, options, batch, device)
        for run in runners.values():  # warm-up: CUDA kernels, allocator, torch pipelining's shape inference
            run()
            run()
        times: dict[str, list[float]] = {key: [] for key in runners}
        for _ in range(rounds):
            for key, run in runners.items():
                times[key].append(timed(run, iters, device))
        out.put(("times", rank, times))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
    out.put(("done", rank, None))


def make_runners(rank: int, world: int, plan_data: dict[str, Any], options: dict[str, Any], batch: int,
                 device: torch.device) -> dict[str, Any]:
    from graphpipe.models import load_model
    from graphpipe.runtime.trainer import PipelineTrainer
    from graphpipe.stages.stage_graph import Plan
    from graphpipe.train import shuffled_batch

    plan = Plan.from_dict(plan_data)
    zoo = load_model("mmt", "tiny", batch_size=batch, seed=0, **options)
    inputs, targets = shuffled_batch(zoo, 0, 0)
    trainer = PipelineTrainer(load_model("mmt", "tiny", batch_size=batch, seed=0, **options).model, plan,
                              optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4), loss_fn=zoo.loss_fn,
                              schedule="1f1b", device=device, host_staged=True)
    return {"graphpipe": lambda: trainer.step(inputs, targets, reduce_loss=False),
            "torch-pipelining": torch_runner(rank, world, plan, options, batch, device, inputs, targets,
                                             zoo.loss_fn)}


def torch_runner(rank: int, world: int, plan: Any, options: dict[str, Any], batch: int, device: torch.device,
                 inputs: Any, targets: Any, loss_fn: Any) -> Any:
    """One step of torch pipelining's Schedule1F1B on this rank's stage of the chain, with Adam."""
    from bench_runtime import pipelining_stage
    from staged_p2p import host_staged_p2p
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from graphpipe.graph.devices import place_graph_on
    from graphpipe.models import load_model

    module = pipelining_stage(load_model("mmt", "tiny", batch_size=batch, seed=0, **options).model, plan, rank)
    module.to(device)
    place_graph_on(module.module, device)
    stage = PipelineStage(module, rank, world, device)
    schedule = Schedule1F1B(stage, batch // plan.stages[0].micro_batch_size, loss_fn=loss_fn)
    optimizer = torch.optim.Adam([p for _, p in module.stage.named_parameters()], lr=1e-4)
    first = tuple(value.to(device) for value in (inputs if isinstance(inputs, tuple) else (inputs,)))
    last = targets.to(device)

    def run() -> None:
        optimizer.zero_grad()
        with host_staged_p2p(force=True):  # the same host round trip as graphpipe's ranks, on the CPU too
            if rank == 0:
                schedule.step(*first)
            elif rank == world - 1:
                schedule.step(target=last, losses=[])
            else:
                schedule.step()
        optimizer.step()

    return run


def timed(run: Any, iters: int, device: torch.device) -> float:
    """Seconds per step over `iters` steps, between barriers, the device idle at both ends."""
    import time

    _idle(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    _idle(device)
    dist.barrier()
    return (time.perf_counter() - start) / iters


def _idle(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def spawn(world: int, args: tuple[Any, ...]) -> list[dict[str, list[float]]]:
    """Each rank's timings from `world` spawned ranks."""
    times: list[dict[str, list[float]]] = [{} for _ in range(world)]
    for _, rank, payload in run_ranks(world, _rank, args):
        times[rank] = payload
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--options", default="{}", help="mmt options as JSON, e.g. '{\"hidden\": 512}'")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("vs_torch: --device cuda, but torch sees no CUDA device")
    if args.batch % args.ranks:
        raise SystemExit(f"vs_torch: --batch {args.batch} must be a multiple of --ranks {args.ranks} (a micro-batch "
                         "per rank)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    options = json.loads(args.options)
    planned = chain_plan(options, args.batch, args.ranks)
    per_rank = spawn(args.ranks, (planned.to_dict(), options, args.batch, args.device, args.rounds, args.iters))
    # a round's time is the slowest rank's (they run between the same barriers): rank 0's is as good as any
    rates = {key: sorted(args.batch / s for s in seconds) for key, seconds in per_rank[0].items()}
    report = {"device": args.device, "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
              "ranks": args.ranks, "batch": args.batch, "micro_batches": args.ranks, "options": options,
              "stages": [str(stage) for stage in planned.stages], "rounds": args.rounds, "iters": args.iters,
              "samples_per_s": {key: {"median": statistics.median(r), "min": r[0], "max": r[-1], "all": r}
                                for key, r in rates.items()}}
    report["ratio_graphpipe_to_torch"] = (report["samples_per_s"]["graphpipe"]["median"]
                                          / report["samples_per_s"]["torch-pipelining"]["median"])
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
