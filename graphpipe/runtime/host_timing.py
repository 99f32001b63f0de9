"""Time the runtime as it runs a pipeline on this host, for `graphpipe.cost.host_calibration.fit_host`.

`workers` gloo ranks (one thread each) train the reference model as the sequential planner's plan of it on
every rank at each micro-batch size (at micro-batch 1 a chain of `workers` stages, one rank each: the
pipeline a plan runs, with its sends and receives, its stages computing at once; from micro-batch 2 on the
planner replicates the model); or (`data_parallel`) as one stage on all of them, every rank computing the
same ops at the same time and all-reducing the gradients. The sizes take turns, one iteration each per
round. Per rank and size it reports the medians of each forward and backward action (a send counts with
the compute that produced it: the host copies and posts it before the next action), of the optimizer step,
of the gradients' all-reduce (a replica's wait for the others included:
`graphpipe.cost.training_collective`), and of the iteration's time outside every action (clearing
gradients, slicing the batch); waits for a receive are the schedule's, which the simulator plays, and are
left out.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from graphpipe.cost.host_calibration import SizeTiming
from graphpipe.errors import CostError
from graphpipe.runtime.spawn_ranks import run_ranks

WARM_UP_STEPS = 2


def measure_runtime(spec: str, preset: str, options: dict[str, Any], batch_size: int, sizes: Sequence[int],
                    workers: int = 2, steps: int = 8, timeout_s: float = 600.0,
                    data_parallel: bool = False) -> list[list[SizeTiming]]:
    """Per rank, a `SizeTiming` per micro-batch size of `sizes`, from `steps` timed iterations of the model
    (`graphpipe.models.load_model(spec, preset, **options)`) as a `workers`-stage chain on `workers` gloo
    ranks, or with `data_parallel` as one stage on all of them (sizes below `workers` left out; see the module
    docstring)."""
    if data_parallel:
        sizes = [size for size in sizes if size >= workers and size % workers == 0]
    arguments = (spec, preset, options, batch_size, tuple(sizes), steps, data_parallel)
    try:
        messages = run_ranks(workers, _rank_main, arguments, timeout_s)
    except RuntimeError as err:
        raise CostError(f"host calibration failed: {err}") from None
    found = {rank: timings for _, rank, timings in messages}
    return [found[rank] for rank in range(workers)]


def _rank_main(rank: int, world: int, port: int, spec: str, preset: str, options: dict[str, Any], batch_size: int,
               sizes: tuple[int, ...], steps: int, data_parallel: bool, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,  # type: ignore[attr-defined]
                              timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=300))
        timings = _time_sizes(rank, world, spec, preset, options, batch_size, sizes, steps, data_parallel)
        dist.destroy_process_group()
        queue.put(("timings", rank, timings))
    except BaseException:
        queue.put(("error", rank, traceback.format_exc()))
    queue.put(("done", rank))


def _time_sizes(rank: int, world: int, spec: str, preset: str, options: dict[str, Any], batch_size: int,
                sizes: tuple[int, ...], steps: int, data_parallel: bool) -> list[SizeTiming]:
    """A `SizeTiming` per size, from `steps` rounds that each time one iteration of every size in turn: a burst of
    another process's work then slows one iteration of each size, not every iteration of one (which would tilt
    the fit's line through the sizes)."""
    from graphpipe.runtime.trainer import PipelineTrainer

    runs: list[tuple[Any, Any, Any, list[dict[str, float]]]] = []
    for size in sizes:
        zoo, plan = _reference_plan(spec, preset, options, batch_size, size, world, data_parallel)
        trainer = PipelineTrainer(zoo.model, plan, loss_fn=zoo.loss_fn, device="cpu", optimizer=_adam)
        stage = next(stage for stage in plan.stages if rank in stage.ranks)
        for _ in range(WARM_UP_STEPS):
            _timed_step(trainer, zoo)
        runs.append((trainer, zoo, stage, []))
    for _ in range(steps):
        for trainer, zoo, _, rows in runs:
            rows.append(_timed_step(trainer, zoo))
    return [_size_timing(stage, rows) for _, _, stage, rows in runs]


def _size_timing(stage: Any, rows: list[dict[str, float]]) -> SizeTiming:
    walls = [row["wall"] for row in rows]
    deciles = statistics.quantiles(walls, n=10)
    return SizeTiming(micro_batch_size=stage.micro_batch_size // len(stage.ranks), ops=stage.ops,
                      fwd_ms=statistics.median(row["fwd"] for row in rows),
                      bwd_ms=statistics.median(row["bwd"] for row in rows),
                      step_ms=statistics.median(row["step"] for row in rows),
                      outside_ms=statistics.median(row["outside"] for row in rows),
                      all_reduce_ms=statistics.median(row["all_reduce"] for row in rows),
                      iteration_ms=statistics.median(walls),
                      iteration_spread=(deciles[-1] - deciles[0]) / statistics.median(walls))


def _timed_step(trainer: Any, zoo: Any) -> dict[str, float]:
    """One iteration: per forward and backward action (with the sends they post), the step, the gradients'
    all-reduce, the rest (ms)."""
    from graphpipe.schedule.action import ActionKind

    start = time.perf_counter()
    trainer.step(zoo.inputs, zoo.targets, reduce_loss=False)
    wall = (time.perf_counter() - start) * 1e3
    kinds = {ActionKind.FORWARD: "fwd", ActionKind.SEND_ACT: "fwd", ActionKind.BACKWARD: "bwd",
             ActionKind.SEND_GRAD: "bwd", ActionKind.STEP: "step", ActionKind.ALL_REDUCE: "all_reduce"}
    totals = {"fwd": 0.0, "bwd": 0.0, "step": 0.0, "all_reduce": 0.0, "actions": 0.0}
    counts = {"fwd": 0, "bwd": 0}
    for event in trainer.executor.events:
        ms = (event.end_s - event.start_s) * 1e3
        totals["actions"] += ms
        kind = kinds.get(event.action.kind)
        if kind is not None:
            totals[kind] += ms
        if event.action.kind in (ActionKind.FORWARD, ActionKind.BACKWARD):
            counts["fwd" if event.action.kind is ActionKind.FORWARD else "bwd"] += 1
    return {"wall": wall, "fwd": totals["fwd"] / max(1, counts["fwd"]), "bwd": totals["bwd"] / max(1, counts["bwd"]),
            "step": totals["step"], "all_reduce": totals["all_reduce"], "outside": wall - totals["actions"]}


def _adam(params: Any) -> Any:
    import torch

    return torch.optim.Adam(params, lr=1e-6)


def _reference_plan(spec: str, preset: str, options: dict[str, Any], batch_size: int, size: int, world: int,
                    data_parallel: bool) -> tuple[Any, Any]:
    """The model and the sequential planner's plan of it on `world` ranks at micro-batch `size`, every rank
    used (a chain of `world` stages where the model splits so), or its one-stage plan on all `world` ranks."""
    import dataclasses

    if data_parallel:
        zoo, whole = _reference_plan(spec, preset, options, batch_size, size, 1, False)
        stage = dataclasses.replace(whole.stages[0], ranks=tuple(range(world)))
        return zoo, dataclasses.replace(whole, stages=(stage,), num_devices=world)
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.cost.cluster import Cluster
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model
    from graphpipe.planning import plan

    zoo = load_model(spec, preset, batch_size=batch_size, seed=0, **options)
    graph = capture(zoo.model, zoo.inputs)
    chain = plan(graph, analytic_costs(graph, "cpu", micro_batch_sizes=[size]), Cluster.preset("local-cpu", world),
                 batch_size, planner="sequential", micro_batch_sizes=[size], use_all_devices=True)
    return zoo, chain


def measure_adam_streaming(num_tensors: int = 64, sizes: tuple[int, int] = (1024, 65536), repeats: int = 15) -> float:
    """The bandwidth (GB/s) at which Adam streams its state on this host's one thread: the step's time on
    `num_tensors` parameters of each of two sizes (floats), the same tensor count so that the per-tensor cost
    cancels; bytes in the rule's `ADAM_PASSES` passes over the difference's time."""
    import torch

    from graphpipe.cost.formulas.time_per_sample import ADAM_PASSES

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        small, large = (_adam_step_s(num_tensors, numel, repeats) for numel in sizes)
    finally:
        torch.set_num_threads(threads)
    extra_bytes = num_tensors * (sizes[1] - sizes[0]) * 4
    return ADAM_PASSES * extra_bytes / max(large - small, 1e-9) / 1e9


def _adam_step_s(num_tensors: int, numel: int, repeats: int) -> float:
    """Lower quartile of Adam's step on `num_tensors` float32 parameters of `numel` each (other processes only
    ever slow it)."""
    import torch

    params = [torch.nn.Parameter(torch.zeros(numel)) for _ in range(num_tensors)]
    for param in params:
        param.grad = torch.ones(numel)
    optimizer = _adam(params)
    optimizer.step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.quantiles(times, n=4)[0]
