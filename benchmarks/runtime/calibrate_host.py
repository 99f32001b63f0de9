"""Measure what a per-op profile cannot see, for the simulator's `local-cpu` model of this machine.

- `measure_link()`: gloo point-to-point over loopback between two single-threaded processes
  (`graphpipe.runtime.loopback`).
- `measure_overheads(...)`: in one process (one thread), run a plan's stage modules in
  topological order on one micro-batch, time each stage's forward (the stage GraphModule call),
  backward (one `torch.autograd.backward`) and Adam step, and subtract what the measured per-op
  profile says its ops take (the Adam step: its fixed part, `step_overhead_us`).
- `measure_executor_overheads(...)`: the same for the runtime's executor itself: a one-rank
  `PipelineTrainer` (in-memory transport) on a one-stage plan of the whole model; its forward
  and backward actions minus the profile's sum over all ops are the device's
  `fwd_action_overhead_us` and `bwd_action_overhead_us` (slicing, loss, the stage call,
  autograd.backward: what the per-op profile does not see).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


# ---- link ----------------------------------------------------------------------------------------
def measure_link(tries: int = 3) -> dict[str, float]:
    """Loopback gloo latency (us, one way) and bandwidth (GB/s) between two single-threaded processes
    (`graphpipe.runtime.loopback.measure_link`)."""
    from graphpipe.runtime.loopback import measure_link as measured

    return measured(tries).to_dict()


# ---- per-action overheads ------------------------------------------------------------------------
def _quiet_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Lower quartile of `repeats` timed calls (ms): other processes on the machine only add time."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return _lower_quartile(times)


def _lower_quartile(values: list[float]) -> float:
    return statistics.quantiles(values, n=4)[0]


def measure_overheads(model: torch.nn.Module, inputs: tuple[Any, ...], targets: Any, loss_fn: Any, plan: Any,
                      measured: Any, micro_batch_size: int, repeats: int = 25) -> dict[str, Any]:
    """Per stage: measured forward / backward / Adam step (ms) vs the profile's sum over its ops."""
    from graphpipe.graph.tracer import trace_module
    from graphpipe.runtime.stage_module import split_stages

    torch.set_num_threads(1)
    gm = trace_module(model)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    data = {name: value[:micro_batch_size] for name, value in zip(names, inputs)}
    values: dict[str, torch.Tensor] = {}
    rows = []
    for stage in split_stages(gm, plan):
        row = _time_stage(stage, data, targets[:micro_batch_size], loss_fn, values, repeats)
        ops = [measured.at(op, micro_batch_size) for op in plan.stages[stage.spec.stage_idx].ops]
        rows.append({"stage": stage.spec.stage_idx, **row, "profile_fwd_ms": sum(o.fwd_ms for o in ops),
                     "profile_bwd_ms": sum(o.bwd_ms for o in ops), "param_bytes": sum(o.param_bytes for o in ops)})
    return {"micro_batch_size": micro_batch_size, "stages": rows,
            "fwd_action_overhead_us": 1e3 * statistics.median(r["fwd_ms"] - r["profile_fwd_ms"] for r in rows),
            "bwd_action_overhead_us": 1e3 * statistics.median(r["bwd_ms"] - r["profile_bwd_ms"] for r in rows),
            "step_ms": [r["step_ms"] for r in rows]}


def _time_stage(stage: Any, data: dict[str, Any], target: Any, loss_fn: Any, values: dict[str, torch.Tensor],
                repeats: int) -> dict[str, float]:
    """Forward, backward and Adam step of one stage (lower quartiles); stores its outputs in `values`."""
    from graphpipe.runtime.stage_module import MODEL_OUTPUT

    spec = stage.spec

    def forward() -> tuple[list[torch.Tensor], list[Any]]:
        received = {n: values[n].detach().requires_grad_(values[n].is_floating_point()) for n in spec.inputs}
        out = stage(data, received)
        roots: list[torch.Tensor] = []
        grads: list[Any] = []
        if spec.is_sink:
            roots.append(loss_fn(out.pop(MODEL_OUTPUT), target))
            grads.append(None)
        for name in spec.outputs:
            value = out[name]
            values[name] = value.detach()
            if isinstance(value, torch.Tensor) and value.requires_grad:
                roots.append(value)
                grads.append(torch.ones_like(value))
        return roots, grads

    fwd_ms = _quiet_ms(forward, repeats)
    bwd_times = []
    for _ in range(repeats + 1):
        roots, grads = forward()
        start = time.perf_counter()
        if roots:
            torch.autograd.backward(roots, grads)
        bwd_times.append((time.perf_counter() - start) * 1e3)
    params = [p for _, p in stage.named_parameters()]
    step_ms = _quiet_ms(torch.optim.Adam(params, lr=1e-6).step, repeats) if params else 0.0
    return {"fwd_ms": fwd_ms, "bwd_ms": _lower_quartile(bwd_times[1:]), "step_ms": step_ms}


def measure_executor_overheads(model: torch.nn.Module, inputs: tuple[Any, ...], targets: Any, loss_fn: Any,
                               plan: Any, measured: Any, steps: int = 12) -> dict[str, float]:
    """Forward / backward action of a one-rank trainer on a one-stage `plan` (lower quartile over the
    steps' actions), minus the profile's sum over its ops."""
    from graphpipe.runtime.comm import InMemoryHub
    from graphpipe.runtime.trainer import PipelineTrainer
    from graphpipe.schedule.action import ActionKind

    assert plan.num_stages == 1 and plan.world_size == 1, "one stage on one rank"
    torch.set_num_threads(1)
    trainer = PipelineTrainer(model, plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-6), loss_fn=loss_fn,
                              transport=InMemoryHub(1).transport(0), rank=0, device="cpu")
    durations: dict[ActionKind, list[float]] = {ActionKind.FORWARD: [], ActionKind.BACKWARD: []}
    for step_idx in range(steps + 1):
        trainer.step(inputs, targets)
        for event in trainer.executor.events if step_idx else ():
            if event.action.kind in durations:
                durations[event.action.kind].append((event.end_s - event.start_s) * 1e3)
    size = plan.stages[0].micro_batch_size
    ops = [measured.at(op, size) for op in plan.stages[0].ops]
    fwd_ms, bwd_ms = (_lower_quartile(durations[k]) for k in (ActionKind.FORWARD, ActionKind.BACKWARD))
    return {"micro_batch_size": size, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
            "profile_fwd_ms": sum(o.fwd_ms for o in ops), "profile_bwd_ms": sum(o.bwd_ms for o in ops),
            "fwd_action_overhead_us": 1e3 * (fwd_ms - sum(o.fwd_ms for o in ops)),
            "bwd_action_overhead_us": 1e3 * (bwd_ms - sum(o.bwd_ms for o in ops))}
