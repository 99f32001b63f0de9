"""Measured training throughput on this machine: graphpipe's graph plan, graphpipe's sequential plan,
and torch.distributed.pipelining on a sequential split, side by side in one run; and the simulator's
prediction of the measured iteration time.

    .venv/bin/python benchmarks/runtime/bench_runtime.py            # writes results/runtime.json
    .venv/bin/python benchmarks/runtime/bench_runtime.py --rounds 3 --iters 3 --models mmt

Two regimes, each with all three variants:
- like-for-like (`graphpipe`, `sequential`, `torch-pipelining`): every variant runs the same number of
  micro-batches (`--micro-batches`, default 4, one per stage of the 4-stage chain, which torch's
  Schedule1F1B needs), so the micro-batch size is the same too; graph against chain is the graph's
  share, graphpipe's chain against torch the runtime's own share;
- best-of (`...-best`): each planner picks its micro-batch; torch pipelining runs the best chain plan,
  with ScheduleGPipe where it has fewer micro-batches than stages (Schedule1F1B cannot run it), and
  not at all when that plan is not a 4-stage chain of one rank each.

First a gloo ping-pong between two processes measures the loopback link (`calibrate_host.py`).
Per model: profile the ops on one CPU thread, calibrate the `cpu` device to that profile
(`graphpipe.cost.calibrate`), measure the runtime's per-action overheads (a one-rank trainer's
forward and backward minus the profile of their ops) and the Adam step, plan with the graphpipe
and sequential planners on a plain `local-cpu` model (the ops alone), and simulate the plans
with the full model (shared cores, action overheads, measured link, the loss all-reduce) and
with each term left out (the ablation). Then 4 ranks (gloo, one thread each) train all the
variants, interleaved round by round so that machine noise hits each alike; each round times
`--iters` iterations and records how much of the cores other processes used meanwhile; the
prediction is compared with the median of the quiet rounds (other processes < 10% of the cores).
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

from graphpipe.stages.stage_graph import Plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibrate_host import measure_executor_overheads, measure_link, measure_overheads

WORLD = 4
CPUS = os.cpu_count() or 1
QUIET = 0.1  # a round is quiet when other processes used less than this share of the cores
HERE = Path(__file__).resolve().parent
MODELS: dict[str, dict[str, Any]] = {
    # the zoo's tiny presets, widened so that compute, not Python overhead, dominates an op
    "mmt": {"num_branches": 4, "num_layers": 2, "hidden": 64, "ffn_hidden": 256, "seq_len": 32},
    "transformer": {"num_layers": 8, "hidden": 64, "ffn_hidden": 256, "seq_len": 32},
}


# ---- planning (parent process) ------------------------------------------------------------------
# Model terms of the prediction; the ablation removes one at a time.
PLANNED = ("graphpipe", "sequential", "graphpipe-best", "sequential-best")
TERMS = ("measured_op_costs", "shared_cores", "action_overheads", "measured_link", "loss_all_reduce")
# Here every variant leaves the loss where it is computed (torch pipelining sums none; graphpipe's runners
# call `step(..., reduce_loss=False)`), so the prediction leaves out the loss's sum over the ranks too.
RUNTIME_TERMS = tuple(term for term in TERMS if term != "loss_all_reduce")


def plan_variants(sizes: list[int], batch: int, micro_batches: int) -> dict[str, tuple[str, list[int]]]:
    """The plans to run: like-for-like, graph and chain at the same number of micro-batches (torch pipelining
    runs the chain one), and best-of, each planner free to pick its micro-batch."""
    same = [batch // micro_batches]
    return {"graphpipe": ("graphpipe", same), "sequential": ("sequential", same),
            "graphpipe-best": ("graphpipe", sizes), "sequential-best": ("sequential", sizes)}


def prepare(name: str, batch: int, link: dict[str, float], micro_batches: int) -> dict[str, Any]:
    """Profile, calibrate (ops, per-action overheads, link), plan (graph and sequential) and simulate one model."""
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.cost.calibrate import fit_device
    from graphpipe.cost.cluster import Cluster, Link
    from graphpipe.cost.profile import profile
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model
    from graphpipe.planning import plan

    zoo = load_model(name, "tiny", batch_size=batch, **MODELS[name])
    graph = capture(zoo.model, zoo.inputs)
    sizes = [s for s in (1, 2, 4, 8, 16, 32) if batch % s == 0 and s <= batch]
    measured = profile(graph, zoo.model, sizes, example_inputs=zoo.inputs, num_threads=1, progress=False)
    fit = fit_device(graph, measured)
    costs = analytic_costs(graph, fit.device, micro_batch_sizes=sizes)
    loopback = Link(name="gloo-loopback-measured", latency_us=link["latency_us"],
                    bandwidth_gb_per_s=link["bandwidth_gb_per_s"])
    plain = dataclasses.replace(Cluster.preset("local-cpu", WORLD), device=fit.device, cores_per_node=None)
    probe = plan(graph, costs, plain, batch, planner="sequential", micro_batch_sizes=[s for s in sizes
                                                                                      if batch // s >= WORLD])
    overheads = measure_overheads(zoo.model, zoo.inputs, zoo.targets, zoo.loss_fn, probe, measured,
                                  probe.stages[0].micro_batch_size)
    # the whole model as one stage on a tiny micro-batch, so that the fixed part of an action dominates
    whole = plan(graph, costs, plain.with_devices(1), batch, planner="sequential", micro_batch_sizes=[1])
    overheads["executor"] = measure_executor_overheads(
        load_model(name, "tiny", batch_size=batch, seed=0, **MODELS[name]).model, zoo.inputs, zoo.targets,
        zoo.loss_fn, whole, measured)
    device = calibrated_device(fit.device, overheads)
    cluster = dataclasses.replace(plain, device=device, intra_node=loopback, inter_node=loopback,
                                  cores_per_node=os.cpu_count() or 1)
    out: dict[str, Any] = {"model": name, "options": MODELS[name], "batch": batch, "micro_batches": micro_batches,
                           "calibration": str(fit),
                           "device": device.to_dict(), "cluster": cluster.to_dict(), "overheads": overheads}
    for variant, (planner, allowed) in plan_variants(sizes, batch, micro_batches).items():
        # planned on the plain model (the ops alone), so that the variants stay the pipelines that are compared
        # with torch pipelining; the calibrated model only predicts
        planned = plan(graph, costs, plain, batch, planner=planner, micro_batch_sizes=allowed)
        tables = {"measured": measured, "fitted": costs}
        out[variant] = {"plan": planned.to_dict(), "predictions": predictions(planned, tables, cluster, fit.device),
                        "simulated_actions_ms": simulated_actions(planned, measured, cluster),
                        "stages": [str(s) for s in planned.stages], "depth": planned.depth}
    return out


def calibrated_device(device: Any, overheads: dict[str, Any]) -> Any:
    """The fitted device with the executor's measured per-action overheads and the optimizer step's fixed cost
    (per stage, on top of streaming its state)."""
    from graphpipe.simulation.comm_model import ADAM_PASSES

    stream_ms = [ADAM_PASSES * r["param_bytes"] / (device.mem_bandwidth_gb_per_s * 1e9) * 1e3
                 for r in overheads["stages"]]
    step_us = statistics.mean(max(0.0, m - s) * 1e3 for m, s in zip(overheads["step_ms"], stream_ms))
    executor = overheads["executor"]
    return dataclasses.replace(device, name=f"{device.name}-host",
                               fwd_action_overhead_us=max(0.0, executor["fwd_action_overhead_us"]),
                               bwd_action_overhead_us=max(0.0, executor["bwd_action_overhead_us"]),
                               step_overhead_us=step_us)


def predictions(planned: Plan, costs: dict[str, Any], cluster: Any, fitted: Any) -> dict[str, float]:
    """Simulated iteration (s) with every term, without each one in turn, and with none (the ops alone)."""
    out = {"full": predict(planned, costs, cluster, fitted, RUNTIME_TERMS)}
    for term in RUNTIME_TERMS:
        out[f"without_{term}"] = predict(planned, costs, cluster, fitted,
                                         tuple(t for t in RUNTIME_TERMS if t != term))
    out["ops_only"] = predict(planned, costs, cluster, fitted, ())
    return out


def simulated_actions(planned: Plan, costs: Any, cluster: Any) -> dict[int, dict[str, float]]:
    """Per rank: simulated ms per event kind in one iteration (what `action_times` measures)."""
    from graphpipe.simulation.simulator import simulate

    events = simulate(planned, costs, cluster, "1f1b").timeline.events
    out: dict[int, dict[str, float]] = {}
    for event in events:
        if event.kind != "transfer":
            for rank in event.ranks:
                out.setdefault(rank, {})
                out[rank][event.kind] = out[rank].get(event.kind, 0.0) + event.duration_ms
    return out


def predict(planned: Plan, costs: dict[str, Any], cluster: Any, fitted: Any, terms: tuple[str, ...],
            loss_collective: Any = None) -> float:
    """One simulated iteration with the chosen model terms; the rest fall back to the plain model (op costs
    from the fitted device, independent cores, no action overheads, the preset loopback link, no loss
    all-reduce). The loss's all-reduce goes on `loss_collective` where given (else the cluster's): ranks meet
    there after the schedule, which the simulation plays, not after replicas computing apart."""
    from graphpipe.cost.cluster import Cluster
    from graphpipe.simulation.comm_model import all_reduce_ms
    from graphpipe.simulation.simulator import simulate

    preset = Cluster.preset("local-cpu", WORLD)
    model = dataclasses.replace(
        cluster, cores_per_node=cluster.cores_per_node if "shared_cores" in terms else None,
        device=cluster.device if "action_overheads" in terms else fitted,
        intra_node=cluster.intra_node if "measured_link" in terms else preset.intra_node,
        inter_node=cluster.inter_node if "measured_link" in terms else preset.inter_node)
    table = costs["measured"] if "measured_op_costs" in terms else costs["fitted"]
    seconds = simulate(planned, table, model, "1f1b").iteration_time_s
    if "loss_all_reduce" in terms:  # trainer.step sums the loss over all ranks after the schedule
        on = model if loss_collective is None else dataclasses.replace(model, collective=loss_collective)
        seconds += all_reduce_ms(on, tuple(range(planned.world_size)), 4) / 1e3
    return seconds


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


def _variants(prepared: dict[str, Any], rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    from graphpipe.models import load_model
    from graphpipe.runtime.trainer import PipelineTrainer
    from graphpipe.train import shuffled_batch

    name, batch = prepared["model"], prepared["batch"]
    zoo = load_model(name, "tiny", batch_size=batch, seed=0, **MODELS[name])
    inputs, targets = shuffled_batch(zoo, 0, 0)
    runners: dict[str, Any] = {}
    trainers: dict[str, Any] = {}
    for variant in PLANNED:
        plan = Plan.from_dict(prepared[variant]["plan"])
        model = load_model(name, "tiny", batch_size=batch, seed=0, **MODELS[name]).model
        trainer = PipelineTrainer(model, plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4),
                                  loss_fn=zoo.loss_fn, schedule="1f1b")
        runners[variant] = lambda t=trainer: t.step(inputs, targets, reduce_loss=False)
        trainers[variant] = trainer
    for chain, torch_variant in (("sequential", "torch-pipelining"), ("sequential-best", "torch-pipelining-best")):
        seq = Plan.from_dict(prepared[chain]["plan"])
        if is_chain(seq):
            runners[torch_variant] = _pipelining_runner(seq, name, batch, rank, inputs, targets, zoo.loss_fn)
    return runners, trainers


def action_times(trainer: Any) -> dict[str, float]:
    """Seconds this rank spent per action kind in the trainer's last iteration (its executor's events)."""
    totals: dict[str, float] = {}
    for event in trainer.executor.events:
        kind = event.action.kind.name.lower()
        totals[kind] = totals.get(kind, 0.0) + event.end_s - event.start_s
    return totals


def is_chain(plan: Plan) -> bool:
    """One rank per stage, stages in a row: torch pipelining can run it (skipping values are carried)."""
    return plan.num_stages == WORLD and all(len(s.ranks) == 1 for s in plan.stages)


def _pipelining_runner(plan: Plan, name: str, batch: int, rank: int, inputs: Any, targets: Any,
                       loss_fn: Any) -> Any:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from graphpipe.models import load_model

    model = load_model(name, "tiny", batch_size=batch, seed=0, **MODELS[name]).model
    module = pipelining_stage(model, plan, rank)
    stage = PipelineStage(module, rank, WORLD, torch.device("cpu"))
    micro_batches = batch // plan.stages[0].micro_batch_size
    kind = Schedule1F1B if micro_batches >= WORLD else ScheduleGPipe  # 1F1B needs a micro-batch per stage
    schedule = kind(stage, micro_batches, loss_fn=loss_fn)
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


def cpu_snapshot(pids: list[int]) -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of `pids`) from /proc; (0, 0) where there is none."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        values = [int(v) for v in fields]
        busy = sum(values) - values[3] - (values[4] if len(values) > 4 else 0)  # all but idle and iowait
        ours = 0
        for pid in pids:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ours += int(stat[11]) + int(stat[12])  # utime, stime
        return busy / tick, ours / tick
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


def timed_round(run: Any, iters: int, pids: list[int], rank: int) -> tuple[float, float, float]:
    """`iters` calls of `run` between two barriers: seconds per call and, on rank 0 (zeros elsewhere), the share
    of the machine's cores other processes used meanwhile and the cores `pids` kept busy (from /proc)."""
    dist.barrier()
    busy, ours = cpu_snapshot(pids) if rank == 0 else (0.0, 0.0)
    start = time.perf_counter()
    for _ in range(iters):
        run()
    dist.barrier()
    wall = time.perf_counter() - start
    if rank != 0:
        return wall / iters, 0.0, 0.0
    busy_end, ours_end = cpu_snapshot(pids)
    return wall / iters, max(0.0, (busy_end - busy) - (ours_end - ours)) / (wall * CPUS), (ours_end - ours) / wall


def _rank_main(rank: int, port: int, prepared: list[dict[str, Any]], rounds: int, iters: int, out: Any) -> None:
    try:
        pids = join_group(rank, port, WORLD)
        for item in prepared:
            runners, trainers = _variants(item, rank)
            times: dict[str, list[float]] = {k: [] for k in runners}
            other: dict[str, list[float]] = {k: [] for k in runners}  # cores' share used by other processes
            ours_load: dict[str, list[float]] = {k: [] for k in runners}  # cores the 4 ranks kept busy
            actions: dict[str, list[dict[str, float]]] = {k: [] for k in trainers}
            for run in runners.values():  # warm-up
                run()
                run()
            for _ in range(rounds):
                for key, run in runners.items():
                    seconds, other_share, ours_cores = timed_round(run, iters, pids, rank)
                    times[key].append(seconds)
                    if rank == 0:
                        other[key].append(other_share)
                        ours_load[key].append(ours_cores)
                    if key in trainers:
                        actions[key].append(action_times(trainers[key]))
            out.put(("actions", (item["model"], rank), actions))
            if rank == 0:
                out.put(("times", item["model"], {"times": times, "other": other, "ours": ours_load}))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
    out.put(("done", rank, None))


def join_group(rank: int, port: int, world: int, timeout_s: float = 120.0) -> list[int]:
    """Join the gloo group of `spawn_ranks`' store on `port` (one torch thread per rank); every rank's pid."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    pids: list[Any] = [None] * world
    dist.all_gather_object(pids, os.getpid())
    return pids


def spawn_ranks(world: int, target: Any, args: tuple[Any, ...], timeout_s: float = 1800) -> list[tuple[Any, ...]]:
    """Run `target(rank, port, *args, queue)` in `world` spawned processes joined by a TCP store; the messages
    they put, (kind, key, payload), until each has put ("done", rank, None). ("error", rank, text) raises."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    queue: Any = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, store.port, *args, queue)) for rank in range(world)]
    for proc in procs:
        proc.start()
    messages, done = [], 0
    while done < world:
        kind, key, payload = queue.get(timeout=timeout_s)
        if kind == "error":
            raise RuntimeError(f"rank {key} failed:\n{payload}")
        messages.append((kind, key, payload))
        done += kind == "done"
    for proc in procs:
        proc.join()
    return messages


def measure(prepared: list[dict[str, Any]], rounds: int, iters: int) -> tuple[dict[str, Any], dict[Any, Any]]:
    messages = spawn_ranks(WORLD, _rank_main, (prepared, rounds, iters))
    results = {key: payload for kind, key, payload in messages if kind == "times"}
    actions = {key: payload for kind, key, payload in messages if kind == "actions"}
    return results, actions


# ---- report -------------------------------------------------------------------------------------
def measured_actions(actions: dict[Any, Any], model: str, variant: str) -> dict[int, dict[str, float]]:
    """Per rank: median over rounds of the ms spent per action kind in one iteration."""
    out: dict[int, dict[str, float]] = {}
    for (name, rank), per_variant in sorted(actions.items()):
        rounds = per_variant.get(variant, []) if name == model else []
        kinds = {k for r in rounds for k in r}
        if rounds:
            out[rank] = {k: 1e3 * statistics.median(r.get(k, 0.0) for r in rounds) for k in sorted(kinds)}
    return out


def summarise(item: dict[str, Any], measured_rounds: dict[str, Any], actions: dict[Any, Any]) -> dict[str, Any]:
    """Per variant: samples/s over all rounds; the prediction against the median of the quiet rounds
    (other processes used < QUIET of the cores), or of all rounds when none was quiet."""
    batch = item["batch"]
    rows: dict[str, Any] = {}
    for key, seconds in measured_rounds["times"].items():
        rates = sorted(batch / s for s in seconds)
        other = measured_rounds["other"].get(key, [])
        quiet = [s for s, load in zip(seconds, other) if load < QUIET]
        rows[key] = {"samples_per_s_median": statistics.median(rates), "samples_per_s_min": rates[0],
                     "samples_per_s_max": rates[-1], "iteration_s_median": statistics.median(seconds),
                     "iteration_s_all": seconds, "other_load_all": other, "num_quiet_rounds": len(quiet),
                     "busy_cores_all": measured_rounds.get("ours", {}).get(key, []),
                     "iteration_s_quiet_median": statistics.median(quiet) if quiet else None}
        if key in PLANNED:
            measured = statistics.median(quiet or seconds)
            everything = statistics.median(seconds)
            predicted = item[key]["predictions"]
            rows[key]["simulated_iteration_s"] = predicted["full"]
            rows[key]["prediction_error"] = (predicted["full"] - measured) / measured
            rows[key]["prediction_error_all_rounds"] = (predicted["full"] - everything) / everything
            rows[key]["actions_ms"] = {"measured": measured_actions(actions, item["model"], key),
                                       "simulated": item[key]["simulated_actions_ms"]}
            rows[key]["ablation"] = {name: {"simulated_iteration_s": value, "error": (value - measured) / measured}
                                     for name, value in predicted.items()}
    return {**{k: v for k, v in item.items() if k not in PLANNED},
            "plans": {k: {"stages": item[k]["stages"], "depth": item[k]["depth"], "plan": item[k]["plan"]}
                      for k in PLANNED},
            "variants": rows, "ratio_to_torch_pipelining": torch_ratios(rows)}


def torch_ratios(rows: dict[str, Any]) -> dict[str, float]:
    """samples/s over torch pipelining's in the same regime (like-for-like, or "-best")."""
    out = {}
    for key, row in rows.items():
        base = rows.get("torch-pipelining-best" if key.endswith("-best") else "torch-pipelining")
        if base:
            out[key] = row["samples_per_s_median"] / base["samples_per_s_median"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mmt,transformer")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--micro-batches", type=int, default=WORLD,
                        help=f"micro-batches per iteration of the like-for-like variants (default {WORLD})")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results" / "runtime.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    link = measure_link()
    print(f"loopback: {link['latency_us']:.0f} us one way, {link['bandwidth_gb_per_s']:.2f} GB/s", file=sys.stderr)
    prepared = [prepare(name, args.batch, link, args.micro_batches) for name in args.models.split(",")]
    for item in prepared:
        print(f"{item['model']}: {item['calibration']}", file=sys.stderr)
        dev = item["device"]
        print(f"  per action: forward {dev['fwd_action_overhead_us']:.0f} us, backward "
              f"{dev['bwd_action_overhead_us']:.0f} us, optimizer step {dev['step_overhead_us']:.0f} us",
              file=sys.stderr)
        for key in PLANNED:
            print(f"  {key}: depth {item[key]['depth']}, {item[key]['stages']}", file=sys.stderr)
    times, actions = measure(prepared, args.rounds, args.iters)
    report = {"machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "ranks": WORLD, "threads_per_rank": 1,
                          "load_average": os.getloadavg()}, "link": link,
              "rounds": args.rounds, "iters_per_round": args.iters,
              "models": [summarise(item, times[item["model"]], actions) for item in prepared]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for model in report["models"]:
        print(model["model"])
        for key, row in model["variants"].items():
            sim = row.get("simulated_iteration_s")
            ablation = ", ".join(f"{k} {v['error']:+.0%}" for k, v in row.get("ablation", {}).items()
                                 if k != "full")
            extra = f", simulated {sim * 1e3:.1f} ms ({row['prediction_error']:+.0%}; {ablation})" if sim else ""
            quiet = row["iteration_s_quiet_median"]
            quiet_text = f", quiet {row['num_quiet_rounds']} rounds {quiet * 1e3:.1f} ms" if quiet else ""
            if row["busy_cores_all"]:
                quiet_text += f", ranks busy {statistics.median(row['busy_cores_all']):.2f} cores"
            print(f"  {key:>16}: {row['samples_per_s_median']:8.1f} samples/s "
                  f"[{row['samples_per_s_min']:.1f}, {row['samples_per_s_max']:.1f}], "
                  f"{row['iteration_s_median'] * 1e3:.1f} ms{quiet_text}{extra}")
        for key in PLANNED:
            acts = model["variants"][key]["actions_ms"]
            for rank, measured in acts["measured"].items():
                simulated = acts["simulated"].get(rank, acts["simulated"].get(str(rank), {}))
                print(f"    {key} rank {rank} ms measured/simulated: " + ", ".join(
                    f"{k} {v:.1f}/{simulated.get(k, 0.0):.1f}" for k, v in measured.items()))
        print("  ratio to torch pipelining:", {k: round(v, 3) for k, v in model["ratio_to_torch_pipelining"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
