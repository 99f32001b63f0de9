"""`graphpipe train`: plan (unless --plan is given), then train with torchrun on this machine.

    graphpipe train --model mmt --preset tiny --nproc 4 --steps 50
    graphpipe train --plan plan.json --nproc 4 --steps 50 --checkpoint-dir ckpt --resume

Many machines: `torchrun <rendezvous flags> -m graphpipe.train --plan plan.json ...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from graphpipe.cli.common import add_granularity_arg, positive_int, print_json
from graphpipe.errors import TrainingError, UsageError
from graphpipe.stages.stage_graph import Plan
from graphpipe.units import format_bytes

FORWARDED = ("model", "preset", "steps", "schedule", "lr", "seed", "checkpoint_dir", "save_every", "trace",
             "timeout", "threads", "dtype", "init", "weights", "optimizer", "batch_norm", "clip_grad_norm",
             "lr_schedule", "warmup_steps", "data", "eval_data", "eval_every", "accumulate", "log_every")
FLAGS = ("resume", "share_gpu")  # forwarded when set


def add_parser(subparsers: Any) -> None:
    from graphpipe.train import add_train_args

    parser = subparsers.add_parser(
        "train", help="train a plan with torch.distributed on this machine (torchrun)",
        description="Train a model with graph pipeline parallelism, one process per device, on this machine. "
                    "Plans first (graphpipe planner on the local-cpu cluster, analytic cpu costs) unless --plan "
                    "is given.")
    add_train_args(parser)
    parser.add_argument("--nproc", type=positive_int, required=True, help="processes (devices) to start")
    parser.add_argument("--plan", default=None, help="plan.json for --nproc devices (default: plan now)")
    parser.add_argument("--mini-batch", "--batch", dest="batch", type=positive_int, default=None,
                        help="mini-batch size when planning (default: the model's example batch); with --plan, a "
                             "multiple of the plan's mini-batch accumulates that many of them per step")
    parser.add_argument("--use-all-devices", action="store_true",
                        help="when planning, keep only plans that use all --nproc devices (default: a plan may "
                             "leave some ranks idle)")
    parser.add_argument("--planner", default="graphpipe", help="planner when planning (default graphpipe)")
    add_granularity_arg(parser)
    parser.add_argument("--json", action="store_true", help="print the per-step metrics as JSON")
    parser.add_argument("--log", default=None, metavar="FILE.jsonl",
                        help="append one JSON line per reported step (--log-every) here as the run goes (loss, "
                             "learning rate, gradient norm, samples/s, peak memory per rank); `graphpipe plot-log` "
                             "draws it")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphpipe.runtime.launch import launch
    from graphpipe.train import cuda_devices_problem, simulation_calibrated, train_args_problem

    problem = train_args_problem(args) or _log_problem(args.log) or _nothing_to_resume(args) \
        or cuda_devices_problem(args.nproc, args.share_gpu)
    if problem:
        raise UsageError(problem)
    _say_sharing(args)
    with tempfile.TemporaryDirectory(prefix="graphpipe-train-") as scratch:
        if args.plan:
            plan_path, plan = args.plan, _given_plan(args)
        else:
            plan_path = _plan_now(args, Path(scratch) / "plan.json")
            plan = Plan.load(plan_path)
        metrics_path = Path(args.log) if args.log else Path(scratch) / "metrics.jsonl"
        before = metrics_path.stat().st_size if metrics_path.exists() else 0  # a resumed run appends
        result = launch(args.nproc, [*_forwarded(args), "--plan", str(plan_path), "--metrics-out", str(metrics_path)])
        if result.returncode != 0:
            raise TrainingError(result.describe() + (f"; the steps done are in {args.log}" if args.log else ""))
        rows = _rows_after(metrics_path, before)
    calibrated = simulation_calibrated(plan)
    if args.json:
        print_json({"plan": str(args.plan or "planned"), "planner": plan.planner, "num_stages": plan.num_stages,
                    "world_size": plan.world_size, "simulation_calibrated": calibrated, "steps": rows})
    else:
        print(render_metrics(rows, calibrated))
        if not calibrated and rows:
            device = (plan.cluster or {}).get("device", {}).get("name", "?")
            print(f"sim ms: uncalibrated: the plan's costs model a {device} device's ops, not this machine's "
                  "per-action overheads, transport and shared cores (`graphpipe simulate` prints what they give)")
    return 0


def _rows_after(path: Path, offset: int) -> list[dict[str, Any]]:
    """The JSON lines this run appended to `path` (from byte `offset` on)."""
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(offset)
        return [json.loads(line) for line in handle.read().decode().splitlines() if line.strip()]


def _log_problem(log: str | None) -> str | None:
    """An unwritable --log, found before any worker starts."""
    if log is None:
        return None
    folder = Path(log).resolve().parent
    if Path(log).is_dir():
        return f"--log {log} is a directory; give a file, e.g. {Path(log) / 'train.jsonl'}"
    if not folder.is_dir():
        return f"--log {log}: the folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (Path(log).exists() and not os.access(log, os.W_OK)):
        return f"--log {log} cannot be written (permissions of {folder}); give a path you can write"
    return None


def _nothing_to_resume(args: argparse.Namespace) -> str | None:
    """--resume where no step was ever saved completely: said here, before any process starts. (Whether
    the newest step is intact the ranks decide, each from the files.)"""
    from graphpipe.runtime.checkpoint import complete_steps

    if args.resume and not complete_steps(args.checkpoint_dir):
        return (f"--resume: {args.checkpoint_dir} holds no complete checkpoint (no step_N/complete); train "
                "without --resume to start from scratch")
    return None


def _given_plan(args: argparse.Namespace) -> Plan:
    """The --plan file, checked here against --nproc and the model: the workers take seconds to start,
    and each would only repeat the same error."""
    plan = Plan.load(args.plan)
    _accumulate_to(args, plan.global_batch_size)
    if plan.world_size > args.nproc:
        raise UsageError(f"the plan uses {plan.world_size} devices but --nproc is {args.nproc}: pass "
                         f"--nproc {plan.world_size} or a plan made for {args.nproc} devices")
    check_plan_fits_model(plan, args)
    _say_idle(plan, args.nproc)
    return plan


def _accumulate_to(args: argparse.Namespace, planned: int) -> None:
    """--mini-batch with --plan: a multiple of the plan's mini-batch sets --accumulate; anything else is refused."""
    if args.batch is None or args.batch == planned * args.accumulate:
        return
    if args.batch % planned or args.accumulate != 1:
        raise UsageError(f"--mini-batch {args.batch} with a plan for mini-batches of {planned}: give a multiple of "
                         f"{planned} (its gradients accumulate over --mini-batch / {planned} mini-batches per step), "
                         "or plan this mini-batch (graphpipe plan --mini-batch ...)")
    args.accumulate = args.batch // planned
    print(f"graphpipe train: each step accumulates {args.accumulate} mini-batches of {planned} (the plan's): "
          f"{args.batch} samples per optimizer step", file=sys.stderr, flush=True)


def _say_idle(plan: Plan, nproc: int) -> None:
    if plan.world_size < nproc:
        idle = f"rank {plan.world_size} stays" if nproc - plan.world_size == 1 else \
            f"ranks {plan.world_size}-{nproc - 1} stay"
        print(f"graphpipe train: the plan uses {plan.world_size} of {nproc} ranks; {idle} idle (plan with "
              "--use-all-devices to use them all)", file=sys.stderr, flush=True)


def check_plan_fits_model(plan: Plan, args: argparse.Namespace) -> None:
    """Capture the model the ranks will build (as `graphpipe.train` resolves it from the plan's model_spec
    and the command line) and check that the plan covers its graph; UsageError if not."""
    from graphpipe.cli.common import capture_from_args, check_plan_fits_graph, model_options

    spec = dict(plan.model_spec)
    name = args.model or spec.get("model")
    if not name:
        raise UsageError(f"plan {args.plan} does not record which model it was made for: pass --model")
    options = {**dict(spec.get("options") or {}), **model_options(args)}
    planned = plan.graph_fingerprint
    namespace = argparse.Namespace(
        model=name, preset=args.preset or spec.get("preset") or "tiny",
        batch=planned.example_batch_size if planned else plan.global_batch_size,
        model_options=[f"{key}={json.dumps(value)}" for key, value in options.items()],
        leaf_modules=args.leaf_modules or list(spec.get("leaf_modules") or ()), seed=args.seed,
        capture=plan.capture)  # built without weights where it can be, whatever --init (capture_from_args)
    _, graph = capture_from_args(namespace)
    if planned is not None:
        _check_same_graph(plan, graph, args, namespace)
    check_plan_fits_graph(plan, graph, args.plan)


def _check_same_graph(plan: Plan, graph: Any, args: argparse.Namespace, given: argparse.Namespace) -> None:
    """UsageError, in one line, unless `graph` is op for op the graph the plan was made on."""
    from graphpipe.graph.fingerprint import difference, fingerprint_of

    assert plan.graph_fingerprint is not None
    found = fingerprint_of(graph)
    where = difference(plan.graph_fingerprint, found.ops, found.shapes)
    if where is None:
        return
    spec = dict(plan.model_spec)
    made_with = {"--model": spec.get("model"), "--preset": spec.get("preset"),
                 "--set": " ".join(f"{k}={json.dumps(v)}" for k, v in dict(spec.get("options") or {}).items()),
                 "--leaf-module": " ".join(spec.get("leaf_modules") or ())}
    used = {"--model": given.model, "--preset": given.preset, "--set": " ".join(given.model_options),
            "--leaf-module": " ".join(given.leaf_modules)}
    changed = [f"{flag} {used[flag] or '(none)'} here, {made_with[flag] or '(none)'} in the plan"
               for flag in made_with if made_with[flag] is not None and (made_with[flag] or "") != (used[flag] or "")]
    why = f" ({'; '.join(changed)})" if changed else (" (the model's code or config is not the one planned)")
    raise UsageError(f"plan {args.plan} was made for another graph than this model's{why}: {where}; re-plan "
                     f"this model (`graphpipe plan --model {given.model} ... -o {Path(args.plan).name}`) or train "
                     "the model the plan was made for")


def _forwarded(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for name in FORWARDED:
        value = getattr(args, name)
        if value is not None:
            out += [f"--{name.replace('_', '-')}", str(value)]
    for item in args.model_options:
        out += ["--set", item]
    for leaf in args.leaf_modules:
        out += ["--leaf-module", leaf]
    out += [f"--{name.replace('_', '-')}" for name in FLAGS if getattr(args, name)]
    return out


def _say_sharing(args: argparse.Namespace) -> None:
    """Where --share-gpu puts the ranks, in one line before they start."""
    if not args.share_gpu:
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    where = (f"no CUDA device is visible: the {args.nproc} ranks compute on the CPU" if count == 0 else
             f"{args.nproc} ranks on {count} GPU(s) (rank i on cuda:i % {count})")
    print(f"graphpipe train: --share-gpu: {where}, over gloo, every message staged through host memory",
          file=sys.stderr, flush=True)


def _plan_now(args: argparse.Namespace, path: Path) -> str:
    """Plan the model for --nproc local CPU workers with analytic `cpu` costs; returns the plan's path."""
    from graphpipe.cli.common import capture_from_args, model_options
    from graphpipe.cli.plan_progress import PlanProgressBar
    from graphpipe.cost.cluster import Cluster
    from graphpipe.cost.sources import choose_costs
    from graphpipe.planning import plan as make_plan
    from graphpipe.train import ACTIVATION_DTYPES

    if not args.model:
        raise UsageError("pass --model (or --plan plan.json) so that there is something to train")
    args.preset = args.preset or "tiny"
    zoo, graph = capture_from_args(args)
    batch = args.batch or zoo.batch_size
    cluster = Cluster.preset("local-cpu", args.nproc)
    costs, source = choose_costs(graph, cluster=cluster, dtype=ACTIVATION_DTYPES[args.dtype])
    with PlanProgressBar(args.planner) as progress:
        planned = make_plan(graph, costs, cluster, batch, planner=args.planner, use_all_devices=args.use_all_devices,
                            granularity=args.granularity, cost_source=source, progress=progress)
    spec = {"model": args.model, "preset": args.preset, "batch": args.batch, "options": model_options(args),
            "leaf_modules": list(args.leaf_modules), "device": cluster.device.name, "capture": graph.capture}
    planned = dataclasses.replace(planned, model_spec=spec)
    planned.save(str(path))
    print(f"graphpipe train: planned {planned}", file=sys.stderr, flush=True)  # stdout is for the results
    for note in planned.notes:
        print(f"graphpipe train: note: {note}", file=sys.stderr, flush=True)
    _say_idle(planned, args.nproc)
    return str(path)


def render_metrics(rows: list[dict[str, Any]], calibrated: bool = True) -> str:
    """One line per step: loss, samples/s, measured and simulated iteration time (`uncal.` where the simulated
    machine is not calibrated to this one: `graphpipe.train.simulation_calibrated`), peak memory."""
    evaluated = any(row.get("eval_loss") is not None for row in rows)
    outside = any(any(row.get("outside_allocator_bytes") or ()) for row in rows)  # CUDA: context, NCCL, ...
    head = f"{'step':>5} {'loss':>10} {'samples/s':>10} {'iter ms':>9} {'sim ms':>8} {'peak/rank (max)':>16}"
    lines = [head + (f" {'outside torch':>14}" if outside else "") + (f" {'eval loss':>10}" if evaluated else "")]
    shown = _shown_rows(rows)
    for row in shown:
        sim = row.get("simulated_iteration_s")
        sim_text = f"{'uncal.':>8}" if not calibrated else f"{sim * 1e3:8.1f}" if sim else f"{'-':>8}"
        peak = max(row.get("peak_memory_bytes") or [0])
        lines.append(f"{row['step']:>5} {row['loss']:>10.5g} {row['samples_per_s']:>10.1f} "
                     f"{row['iteration_s'] * 1e3:>9.1f} {sim_text} {format_bytes(peak):>16}"
                     + (f" {format_bytes(max(row.get('outside_allocator_bytes') or [0])):>14}" if outside else "")
                     + (f" {_eval_text(row.get('eval_loss'))}" if evaluated else ""))
    if len(shown) < len(rows):
        lines.append(f"({len(shown)} of {len(rows)} steps shown: the first, every {_stride(rows)}th, those evaluated "
                     "and the last; --log FILE.jsonl or --json has every reported one: --log-every)")
    return "\n".join(lines)


MAX_ROWS = 25  # a longer run's table shows a sample of its steps


def _stride(rows: list[dict[str, Any]]) -> int:
    return -(-len(rows) // (MAX_ROWS - 5))


def _shown_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row of a short run; of a long one the first, every stride-th, those with an eval loss, the last."""
    if len(rows) <= MAX_ROWS:
        return rows
    stride = _stride(rows)
    return [row for index, row in enumerate(rows) if index == 0 or index == len(rows) - 1
            or (index + 1) % stride == 0 or row.get("eval_loss") is not None]


def _eval_text(loss: float | None) -> str:
    return f"{loss:>10.5g}" if loss is not None else f"{'':>10}"
