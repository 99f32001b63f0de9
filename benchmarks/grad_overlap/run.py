"""Data-parallel gradient reduction overlapped with the backward, against reducing after it, on this CPU.

    .venv/bin/python benchmarks/grad_overlap/run.py --rounds 7 --iters 3     # ~2 min; writes results.json

Two gloo ranks (one thread each) train one data-parallel stage of an MLP (16 layers of width 1024, 16.8 M
parameters: 64 MiB of float32 gradients, 3 buckets of 25 MiB), mini-batch 8 in 2 micro-batches, with Adam,
two variants interleaved round by round on the same weights and batches: `PipelineTrainer(...,
overlap_grad_reduce=True)` (buckets launched during the last backward) and `False` (one all-reduce after
it). Each round times `--iters` steps between barriers; the losses of both variants are checked equal, step
for step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from bench_runtime import join_group, spawn_ranks

from graphpipe.graph.tracer import trace_module
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.stages.stage_graph import Plan, Stage

WORLD, WIDTH, DEPTH, BATCH, MICRO = 2, 1024, 16, 8, 4
HERE = Path(__file__).resolve().parent


def model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


def data_parallel_plan(net: nn.Module) -> Plan:
    """One stage on both ranks: pure data parallelism, 2 micro-batches of 4 (2 samples per rank each)."""
    ops = tuple(node.name for node in trace_module(net).graph.nodes)
    stage = Stage(idx=0, ops=ops, ranks=tuple(range(WORLD)), micro_batch_size=MICRO, in_flight_samples=MICRO)
    return Plan(graph_name="mlp", stages=(stage,), edges=(), global_batch_size=BATCH, num_devices=WORLD,
                planner="manual")


def _rank_main(rank: int, port: int, rounds: int, iters: int, out: Any) -> None:
    try:
        join_group(rank, port, WORLD, timeout_s=300)
        net = model()
        plan = data_parallel_plan(net)
        gen = torch.Generator().manual_seed(1)
        inputs, targets = torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen)
        trainers = {overlap: PipelineTrainer(model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4),
                                             loss_fn=nn.functional.mse_loss, overlap_grad_reduce=overlap)
                    for overlap in (True, False)}
        times: dict[str, list[float]] = {"overlapped": [], "after backward": []}
        losses: dict[str, list[float]] = {key: [] for key in times}
        for _ in range(2):  # warm-up, the same steps for both
            for overlap, trainer in trainers.items():
                losses[_key(overlap)].append(trainer.step(inputs, targets))
        for _ in range(rounds):
            for overlap, trainer in trainers.items():
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    losses[_key(overlap)].append(trainer.step(inputs, targets))
                dist.barrier()
                times[_key(overlap)].append((time.perf_counter() - start) / iters)
        early = trainers[True].executor.buckets
        if rank == 0:
            out.put(("result", 0, {"times": times, "losses": losses, "buckets": len(early.buckets),
                                   "launched_during_backward": early.launched_early}))
        for trainer in trainers.values():
            trainer.close()
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
    out.put(("done", rank, None))


def _key(overlap: bool) -> str:
    return "overlapped" if overlap else "after backward"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    messages = spawn_ranks(WORLD, _rank_main, (args.rounds, args.iters))
    result = next(payload for kind, _, payload in messages if kind == "result")
    same = result["losses"]["overlapped"] == result["losses"]["after backward"]
    summary = {name: {"median_ms": 1e3 * statistics.median(values), "min_ms": 1e3 * min(values),
                      "max_ms": 1e3 * max(values)} for name, values in result["times"].items()}
    ratios = [after / over for over, after in zip(result["times"]["overlapped"], result["times"]["after backward"])]
    record = {"world": WORLD, "width": WIDTH, "depth": DEPTH, "batch": BATCH, "micro_batch": MICRO,
              "rounds": args.rounds, "iters": args.iters, "load_before": load, "buckets": result["buckets"],
              "launched_during_backward": result["launched_during_backward"], "losses_equal": same,
              "step_ms": summary, "speedup_per_round": ratios, "speedup_median": statistics.median(ratios),
              "torch": torch.__version__}
    (HERE / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    for name, row in summary.items():
        print(f"{name:>15}: {row['median_ms']:.1f} ms/step median [{row['min_ms']:.1f}, {row['max_ms']:.1f}]")
    print(f"after / overlapped, per round: median {record['speedup_median']:.3f}x "
          f"[{min(ratios):.3f}, {max(ratios):.3f}]; losses equal: {same}; "
          f"{result['launched_during_backward']} of {result['buckets']} buckets launched during the backward")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
