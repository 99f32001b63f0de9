"""Multi-rank graph pipelines on the GPU(s), in float64, against one device: the check `make gpu-check` runs.

    python benchmarks/gpu/pipeline_check.py --transport nccl --ranks 4          # one GPU per rank, NCCL
    python benchmarks/gpu/pipeline_check.py --transport shared --ranks 4        # ranks share cuda:0, gloo
    python benchmarks/gpu/pipeline_check.py --transport shared --ranks 3 --device cpu   # the same on the CPU
    python benchmarks/gpu/pipeline_check.py --transport gloo --ranks 4 --device cpu     # plain gloo, no staging

Spawns `--ranks` processes joined in one process group and trains, in it, every scenario of
`tests/runtime/scenarios.py` named by `--scenarios` whose plan fits (a plan for fewer ranks leaves the
others idle), under every schedule the scenario lists, `--steps` Adam steps in float64. `nccl`: rank i on
cuda:i; `shared`: every rank on cuda:(i % GPUs) over gloo, messages and collectives staged through host
memory (`graphpipe.runtime.host_staging`; forced on the CPU too, so that the rehearsal runs that path).
The reference trains the whole model on one device (cuda:0, or the CPU) on the same batches; the losses
and every parameter must agree within `--rtol`. Prints one JSON object; exit 1 when a scenario differs.

The default scenarios: `tied_towers3` (a fork/join whose embedding is read on two branch stages and tied to
the output layer on the join: a shared weight over three stages), `dp_sink4` (a fork/join whose sink is
data-parallel over two ranks: the bucketed gradient all-reduce), `diamond3` (a plain fork/join), and
`tied_towers2` (the tied weight over two stages, for two GPUs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the scenarios live in the test tree

from graphpipe.runtime.spawn_ranks import run_ranks  # noqa: E402

DEFAULT_SCENARIOS = "tied_towers2,diamond3,tied_towers3,dp_sink4"


def scenarios() -> dict[str, Any]:
    """The test scenarios, plus `tied_towers2`: the tied embedding on two stages (two GPUs can run it)."""
    from tests.runtime.helpers import plan_from
    from tests.runtime.scenarios import SCENARIOS, tied_stage

    def two_stages(node: Any) -> int | None:
        stage = tied_stage(node)
        return None if stage is None else min(stage, 1)

    tied = SCENARIOS["tied_towers3"]
    tied2 = dataclasses.replace(tied, name="tied_towers2", make_plan=lambda m: plan_from(
        m, two_stages, [(0,), (1,)], micro_batch_size=2, global_batch_size=8))
    return {**SCENARIOS, tied2.name: tied2}


def device_of(rank: int, device: str) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", rank % torch.cuda.device_count())


def _rank(rank: int, world: int, port: int, transport: str, device_name: str, jobs: list[tuple[str, str]],
          steps: int, out: Any) -> None:
    try:
        torch.set_num_threads(1)
        device = device_of(rank, device_name)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=timedelta(seconds=120))
        nccl = transport == "nccl"
        dist.init_process_group("nccl" if nccl else "gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=120), device_id=device if nccl else None)
        for name, schedule in jobs:
            out.put(("result", rank, f"{name}/{schedule}", train(name, schedule, steps, device,
                                                                 transport == "shared")))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, "", traceback.format_exc()))
    out.put(("done", rank, "", None))


def train(name: str, schedule: str, steps: int, device: torch.device, host_staged: bool) -> dict[str, Any]:
    """Losses and this rank's parameters (lists, on the host) after `steps` steps of `name` in float64."""
    from graphpipe.runtime.trainer import PipelineTrainer
    from tests.runtime.scenarios import LR, float64_scenario

    scenario = float64_scenario(scenarios()[name])
    example = scenario.make_batches(1)[0][0]
    trainer = PipelineTrainer(scenario.model(), scenario.plan(), optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                              loss_fn=scenario.loss_fn, schedule=schedule, example_inputs=example, device=device,
                              host_staged=host_staged or None)
    with trainer:
        losses = [trainer.step(inputs, targets) for inputs, targets in scenario.make_batches(steps)]
        params = {key: value.detach().cpu().tolist() for key, value in trainer.named_parameters()}
    return {"losses": losses, "params": params, "transport": type(trainer.transport).__name__,
            "device": str(device)}


def reference(name: str, steps: int, device: torch.device) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One device's float64 losses and parameters (`tests.runtime.scenarios.reference`, on `device`)."""
    from graphpipe.model_inputs import as_model_inputs
    from tests.runtime.scenarios import LR, float64_scenario

    scenario = float64_scenario(scenarios()[name])
    model = scenario.model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for inputs, targets in scenario.make_batches(steps):
        optimizer.zero_grad()
        given = as_model_inputs(_on(inputs, device))
        loss = scenario.loss_fn(model(*given.args, **dict(given.kwargs)), _on(targets, device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {key: p.detach().cpu() for key, p in model.named_parameters()}


def _on(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_on(item, device) for item in value)
    return value


def run(args: argparse.Namespace) -> dict[str, Any]:
    known = scenarios()
    names = [name for name in args.scenarios.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"pipeline_check: unknown scenario(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    fits = [name for name in names if known[name].world_size <= args.ranks]
    left_out = {name: f"needs {known[name].world_size} ranks" for name in names if name not in fits}
    jobs = [(name, schedule) for name in fits for schedule in known[name].schedules]
    results = spawn(args.ranks, args.transport, args.device, jobs, args.steps)
    ref_device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    checks = [judge(name, schedule, results[f"{name}/{schedule}"], reference(name, args.steps, ref_device),
                    args.rtol) for name, schedule in jobs]
    return {"transport": args.transport, "device": args.device, "ranks": args.ranks, "steps": args.steps,
            "rtol": args.rtol, "checks": checks, "left_out": left_out,
            "passed": bool(checks) and all(check["passed"] for check in checks)}


def judge(name: str, schedule: str, per_rank: list[dict[str, Any]], expected: tuple[list[float], dict[str, Any]],
          rtol: float) -> dict[str, Any]:
    from tests.runtime.scenarios import compare

    working = [result for result in per_rank if result["params"] or all(loss == loss for loss in result["losses"])]
    losses = working[0]["losses"]
    params = {key: torch.tensor(value, dtype=torch.float64) for result in working
              for key, value in result["params"].items()}
    problems = compare(losses, params, *expected, rtol=rtol)
    if sorted(params) != sorted(expected[1]):
        problems.append("the stages do not hold every parameter exactly once")
    if any(result["losses"] != losses for result in working):
        problems.append("the ranks report different losses")
    gap = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, expected[0])), default=float("inf"))
    return {"scenario": name, "schedule": schedule, "ranks_used": len(working), "losses": losses,
            "reference": expected[0], "max_rel_loss_diff": gap, "transport": working[0]["transport"],
            "devices": sorted({result["device"] for result in working}), "problems": problems,
            "passed": not problems}


def spawn(world: int, transport: str, device: str, jobs: list[tuple[str, str]], steps: int) -> dict[str, list[Any]]:
    """Every job's per-rank results from `world` spawned ranks."""
    results: dict[str, list[Any]] = {f"{name}/{schedule}": [None] * world for name, schedule in jobs}
    for _, rank, key, payload in run_ranks(world, _rank, (transport, device, jobs, steps)):
        results[key][rank] = payload
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=("nccl", "shared", "gloo"), required=True,
                        help="nccl: a GPU per rank; shared: the ranks share the GPUs over gloo, staged through host; "
                             "gloo: plain gloo on the CPU (the CPU rehearsal of nccl)")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--scenarios", default=DEFAULT_SCENARIOS)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rtol", type=float, default=1e-9, help="float64 on both sides (default 1e-9)")
    args = parser.parse_args(argv)
    if args.transport == "nccl" and (args.device != "cuda" or torch.cuda.device_count() < args.ranks):
        raise SystemExit(f"pipeline_check: --transport nccl needs a GPU per rank ({args.ranks}); this machine has "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    if args.transport == "gloo" and args.device != "cpu":
        raise SystemExit("pipeline_check: --transport gloo runs on the CPU (--device cpu); ranks on a GPU: shared")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pipeline_check: --device cuda, but torch sees no CUDA device")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report = run(args)
    print(json.dumps(report, indent=1))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
