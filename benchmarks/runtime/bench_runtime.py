"""Measured training throughput on this machine: graphpipe's graph plan, graphpipe's sequential plan,
and torch.distributed.pipelining's Schedule1F1B on a sequential split, side by side in one run.

    .venv/bin/python benchmarks/runtime/bench_runtime.py            # writes results/runtime.json
    .venv/bin/python benchmarks/runtime/bench_runtime.py --rounds 3 --iters 3 --models mmt

Per model: profile the ops on one CPU thread, calibrate the `cpu` device to that profile
(`graphpipe.cost.calibrate`), plan with the graphpipe and sequential planners on a
`local-cpu` cluster of 4 workers with the calibrated device, and simulate both plans.
Then 4 ranks (gloo, one thread each) train all three variants, interleaved round by
round so that machine noise hits each alike; each round times `--iters` iterations.
torch pipelining runs the sequential plan's stages (its ops, its micro-batch size).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from graphpipe.planner.stage_graph import Plan

WORLD = 4
HERE = Path(__file__).resolve().parent
MODELS: dict[str, dict[str, Any]] = {
    # the zoo's tiny presets, widened so that compute, not Python overhead, dominates an op
    "mmt": {"num_branches": 4, "num_layers": 2, "hidden": 64, "ffn_hidden": 256, "seq_len": 32},
    "transformer": {"num_layers": 8, "hidden": 64, "ffn_hidden": 256, "seq_len": 32},
}


# ---- planning (parent process) ------------------------------------------------------------------
def prepare(name: str, batch: int) -> dict[str, Any]:
    """Profile, calibrate, plan (graph and sequential) and simulate one model."""
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.cost.calibrate import fit_device
    from graphpipe.cost.cluster import Cluster
    from graphpipe.cost.profile import profile
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model
    from graphpipe.planning import plan
    from graphpipe.simulation.simulator import simulate

    zoo = load_model(name, "tiny", batch_size=batch, **MODELS[name])
    graph = capture(zoo.model, zoo.inputs)
    sizes = [s for s in (1, 2, 4, 8, 16, 32) if batch % s == 0 and s <= batch]
    measured = profile(graph, zoo.model, sizes, example_inputs=zoo.inputs, num_threads=1, progress=False)
    fit = fit_device(graph, measured)
    cluster = dataclasses.replace(Cluster.preset("local-cpu", WORLD), device=fit.device)
    costs = analytic_costs(graph, fit.device, micro_batch_sizes=sizes)
    shared = shared_cores(fit.device)
    shared_cluster = dataclasses.replace(cluster, device=shared)
    shared_costs = analytic_costs(graph, shared, micro_batch_sizes=sizes)
    out: dict[str, Any] = {"model": name, "options": MODELS[name], "batch": batch, "calibration": str(fit)}
    for planner in ("graphpipe", "sequential"):
        planned = plan(graph, costs, cluster, batch, planner=planner)
        result = simulate(planned, costs, cluster, "1f1b")
        contended = simulate(planned, shared_costs, shared_cluster, "1f1b")
        out[planner] = {"plan": planned.to_dict(), "simulated_iteration_s": result.iteration_time_s,
                        "simulated_shared_cores_iteration_s": contended.iteration_time_s,
                        "stages": [str(s) for s in planned.stages], "depth": planned.depth}
    return out


def shared_cores(device: Any) -> Any:
    """The calibrated device slowed by cores / ranks: 4 ranks on fewer cores share them when all are busy."""
    share = min(1.0, (os.cpu_count() or WORLD) / WORLD)
    return dataclasses.replace(device, name=f"{device.name}-shared", peak_tflops=device.peak_tflops * share,
                               elementwise_tflops=device.elementwise_tflops * share,
                               mem_bandwidth_gb_per_s=device.mem_bandwidth_gb_per_s * share,
                               kernel_overhead_us=device.kernel_overhead_us / share)


# ---- ranks --------------------------------------------------------------------------------------
class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is contiguous: pipelining receives gradients into buffers laid out like them,
    and gloo only receives into contiguous tensors."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor) -> torch.Tensor:
        return value.view_as(value)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class ChainStage(nn.Module):
    """One stage of a sequential split for torch pipelining: takes and returns every value later stages need.

    torch pipelining passes one tuple from each stage to the next, so model inputs and activations
    that skip stages travel along through the stages in between.
    """

    def __init__(self, stage: Any, carry_in: tuple[str, ...], carry_out: tuple[str, ...]) -> None:
        super().__init__()
        self.stage, self.module = stage, stage.module
        self.carry_in, self.carry_out = carry_in, carry_out

    def forward(self, *args: torch.Tensor) -> Any:
        from graphpipe.runtime.stage_module import MODEL_OUTPUT

        values = {n: _ContiguousGrad.apply(a) if a.requires_grad else a for n, a in zip(self.carry_in, args)}
        result = self.stage(values, values)
        if self.stage.spec.is_sink:
            return result[MODEL_OUTPUT]
        passed = {n: values[n].clone() for n in self.carry_out if n not in result}  # a fresh tensor per hop
        return tuple(result[n].contiguous() if n in result else passed[n] for n in self.carry_out)


def pipelining_stage(model: nn.Module, plan: Plan, rank: int) -> ChainStage:
    from graphpipe.graph.tracer import trace_module
    from graphpipe.runtime.stage_module import split_stages

    gm = trace_module(model)
    stages = split_stages(gm, plan)
    inputs = tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")
    order = [n.name for n in gm.graph.nodes]

    def carry(k: int) -> tuple[str, ...]:
        if k == 0:
            return inputs
        made = set(inputs) | {v for s in stages[:k] for v in s.spec.outputs}
        needed = {v for s in stages[k:] for v in (*s.spec.data_inputs, *s.spec.inputs)}
        return tuple(v for v in order if v in made and v in needed)

    carry_out = carry(rank + 1) if rank + 1 < len(stages) else ()
    return ChainStage(stages[rank], carry(rank), carry_out)


def _variants(prepared: dict[str, Any], rank: int) -> dict[str, Any]:
    from graphpipe.models import load_model
    from graphpipe.runtime.trainer import PipelineTrainer
    from graphpipe.train import shuffled_batch

    name, batch = prepared["model"], prepared["batch"]
    zoo = load_model(name, "tiny", batch_size=batch, seed=0, **MODELS[name])
    inputs, targets = shuffled_batch(zoo, 0, 0)
    runners: dict[str, Any] = {}
    for planner in ("graphpipe", "sequential"):
        plan = Plan.from_dict(prepared[planner]["plan"])
        model = load_model(name, "tiny", batch_size=batch, seed=0, **MODELS[name]).model
        trainer = PipelineTrainer(model, plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4),
                                  loss_fn=zoo.loss_fn, schedule="1f1b")
        runners[planner] = lambda t=trainer: t.step(inputs, targets)
    seq = Plan.from_dict(prepared["sequential"]["plan"])
    if is_chain(seq):
        runners["torch-pipelining"] = _pipelining_runner(seq, name, batch, rank, inputs, targets, zoo.loss_fn)
    return runners


def is_chain(plan: Plan) -> bool:
    """One rank per stage, stages in a row: torch pipelining can run it (skipping values are carried)."""
    return plan.num_stages == WORLD and all(len(s.ranks) == 1 for s in plan.stages)


def _pipelining_runner(plan: Plan, name: str, batch: int, rank: int, inputs: Any, targets: Any,
                       loss_fn: Any) -> Any:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from graphpipe.models import load_model

    model = load_model(name, "tiny", batch_size=batch, seed=0, **MODELS[name]).model
    module = pipelining_stage(model, plan, rank)
    stage = PipelineStage(module, rank, WORLD, torch.device("cpu"))
    schedule = Schedule1F1B(stage, batch // plan.stages[0].micro_batch_size, loss_fn=loss_fn)
    params = [p for _, p in module.stage.named_parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-4)

    def run() -> None:
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(*inputs)
        elif rank == WORLD - 1:
            schedule.step(target=targets, losses=[])
        else:
            schedule.step()
        optimizer.step()

    return run


def _rank_main(rank: int, port: int, prepared: list[dict[str, Any]], rounds: int, iters: int, out: Any) -> None:
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, WORLD + 1, is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=120))
        for item in prepared:
            runners = _variants(item, rank)
            times: dict[str, list[float]] = {k: [] for k in runners}
            for run in runners.values():  # warm-up
                run()
                run()
            for _ in range(rounds):
                for key, run in runners.items():
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(iters):
                        run()
                    dist.barrier()
                    times[key].append((time.perf_counter() - start) / iters)
            if rank == 0:
                out.put(("times", item["model"], times))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
    out.put(("done", rank, None))


def measure(prepared: list[dict[str, Any]], rounds: int, iters: int) -> dict[str, dict[str, list[float]]]:
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, WORLD + 1, is_master=True, wait_for_workers=False)
    queue: Any = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, store.port, prepared, rounds, iters, queue)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    results: dict[str, dict[str, list[float]]] = {}
    done = 0
    while done < WORLD:
        kind, key, payload = queue.get(timeout=1800)
        if kind == "error":
            raise RuntimeError(f"rank {key} failed:\n{payload}")
        if kind == "times":
            results[key] = payload
        done += kind == "done"
    for proc in procs:
        proc.join()
    return results


# ---- report -------------------------------------------------------------------------------------
def summarise(item: dict[str, Any], times: dict[str, list[float]]) -> dict[str, Any]:
    batch = item["batch"]
    rows: dict[str, Any] = {}
    for key, seconds in times.items():
        rates = sorted(batch / s for s in seconds)
        rows[key] = {"samples_per_s_median": statistics.median(rates), "samples_per_s_min": rates[0],
                     "samples_per_s_max": rates[-1], "iteration_s_median": statistics.median(seconds),
                     "iteration_s_all": seconds}
        if key in ("graphpipe", "sequential"):
            measured = statistics.median(seconds)
            for field in ("simulated_iteration_s", "simulated_shared_cores_iteration_s"):
                rows[key][field] = item[key][field]
            rows[key]["prediction_error"] = (item[key]["simulated_iteration_s"] - measured) / measured
            rows[key]["prediction_error_shared_cores"] = (
                item[key]["simulated_shared_cores_iteration_s"] - measured) / measured
    base = rows.get("torch-pipelining", {}).get("samples_per_s_median")
    ratios = {k: v["samples_per_s_median"] / base for k, v in rows.items()} if base else {}
    return {**{k: v for k, v in item.items() if k not in ("graphpipe", "sequential")},
            "plans": {k: {"stages": item[k]["stages"], "depth": item[k]["depth"]} for k in ("graphpipe", "sequential")},
            "variants": rows, "ratio_to_torch_pipelining": ratios}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mmt,transformer")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results" / "runtime.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prepared = [prepare(name, args.batch) for name in args.models.split(",")]
    for item in prepared:
        print(f"{item['model']}: {item['calibration']}", file=sys.stderr)
        for key in ("graphpipe", "sequential"):
            print(f"  {key}: depth {item[key]['depth']}, {item[key]['stages']}", file=sys.stderr)
    times = measure(prepared, args.rounds, args.iters)
    report = {"machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "ranks": WORLD, "threads_per_rank": 1},
              "rounds": args.rounds, "iters_per_round": args.iters,
              "models": [summarise(item, times[item["model"]]) for item in prepared]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for model in report["models"]:
        print(model["model"])
        for key, row in model["variants"].items():
            sim = row.get("simulated_iteration_s")
            extra = (f", simulated {sim * 1e3:.1f} ms ({row['prediction_error']:+.0%}), shared cores "
                     f"{row['simulated_shared_cores_iteration_s'] * 1e3:.1f} ms "
                     f"({row['prediction_error_shared_cores']:+.0%})") if sim else ""
            print(f"  {key:>16}: {row['samples_per_s_median']:8.1f} samples/s "
                  f"[{row['samples_per_s_min']:.1f}, {row['samples_per_s_max']:.1f}], "
                  f"{row['iteration_s_median'] * 1e3:.1f} ms{extra}")
        print("  ratio to torch pipelining:", {k: round(v, 3) for k, v in model["ratio_to_torch_pipelining"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
