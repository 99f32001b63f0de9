"""`python -m graphpipe.train`: one rank of a pipeline training run, started by torchrun.

    torchrun --nproc-per-node 4 -m graphpipe.train --plan plan.json --steps 50
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint host:29500 ... -m graphpipe.train --plan plan.json

The model comes from --model/--preset (default: the plan's `model_spec`), built with the
same seed on every rank. The data is `--data` (`graphpipe.runtime.data`: a dataset or an iterable of
mini-batches, the same on every rank), or else the model's example batch of the plan's mini-batch size,
its rows shuffled every step by a generator seeded with (seed, step).
Rank 0 shows a progress bar and writes per-step metrics (--metrics-out, JSON lines).
A rank that fails prints `rank R: error: ...` and exits non-zero; torchrun stops the rest.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from graphpipe.errors import GraphPipeError, TrainingError
from graphpipe.model_inputs import ModelInputs
from graphpipe.runtime.batch_norm import BATCH_NORM_MODES
from graphpipe.runtime.lr_schedule import SCHEDULES, lr_factor
from graphpipe.runtime.output_paths import output_paths_problem
from graphpipe.schedule.generate import SCHEDULE_NAMES
from graphpipe.stages.stage_graph import Plan

AUTOCAST: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
ACTIVATION_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # what the cost model counts activations in
INIT_MODES = ("model", "meta")
OPTIMIZERS: dict[str, Any] = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}
EVERY_STEP_UP_TO = 100  # --log-every's default: every step of a run this long, else every LOG_EVERY_LONG
LOG_EVERY_LONG = 10
KILL_ENV = "GRAPHPIPE_KILL_AT"  # "RANK:STEP": that rank kills itself at that step (fault-injection tests)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m graphpipe.train", description=__doc__.split("\n\n")[0])
    add_train_args(parser)
    parser.add_argument("--plan", required=True, help="plan.json made for this world size")
    parser.add_argument("--metrics-out", default=None, help="rank 0 appends one JSON line per step here")
    return parser


def add_train_args(parser: argparse.ArgumentParser) -> None:
    """The options `graphpipe train` forwards to every rank."""
    parser.add_argument("--model", default=None, help="zoo name or path/to/file.py:factory (default: the plan's)")
    parser.add_argument("--preset", default=None, help="model size preset (default: the plan's, else tiny)")
    parser.add_argument("--set", dest="model_options", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model option (repeatable)")
    parser.add_argument("--leaf-module", dest="leaf_modules", action="append", default=[], metavar="NAME",
                        help="keep this submodule as one op (repeatable; must match how the plan was made)")
    parser.add_argument("--capture", choices=("auto", "fx", "export"), default=None,
                        help="how to capture the model when planning it here (graphpipe train without --plan); "
                             "the ranks capture it as the plan records")
    parser.add_argument("--data", default=None, metavar="FILE.py:factory",
                        help="training data: the factory returns a dataset of (inputs, target) samples or an "
                             "iterable of (inputs, targets) mini-batches (default: the model's example batch, its "
                             "rows shuffled each step)")
    parser.add_argument("--eval-data", default=None, metavar="FILE.py:factory",
                        help="validation data, as --data: its whole mini-batches are evaluated forward only (eval "
                             "mode, no gradients) every --eval-every steps and after the last")
    parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                        help="evaluate --eval-data every N steps (default 0: only after the last step)")
    parser.add_argument("--accumulate", type=int, default=1, metavar="K",
                        help="each step adds up the gradients of K of the plan's mini-batches before one optimizer "
                             "step: a mini-batch K times the plan's (default 1)")
    parser.add_argument("--steps", type=int, default=10, help="train until this many steps are done")
    parser.add_argument("--schedule", choices=SCHEDULE_NAMES, default=None, help="schedule (default: the plan's)")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--lr-schedule", choices=SCHEDULES, default="constant",
                        help="learning rate over the --steps: constant (default), or a linear or cosine decay to 0 at "
                             "the last step, after --warmup-steps")
    parser.add_argument("--warmup-steps", type=int, default=0,
                        help="raise the learning rate linearly to --lr over this many first steps (default 0)")
    parser.add_argument("--clip-grad-norm", type=float, default=None, metavar="C",
                        help="scale the gradients so that their global norm (every stage and replica, a shared "
                             "weight once) is at most C, as torch.nn.utils.clip_grad_norm_ on one device")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam",
                        help="adam (default), or sgd: plain SGD, no optimizer state (half the memory per parameter)")
    parser.add_argument("--seed", type=int, default=0, help="model weights and data shuffling")
    parser.add_argument("--checkpoint-dir", default=None, help="save step_N/ checkpoints here")
    parser.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only at the end)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    parser.add_argument("--trace", default=None, metavar="DIR", help="write a Chrome trace per rank into DIR")
    parser.add_argument("--log-every", type=int, default=None, metavar="N",
                        help="sum the loss over the ranks (a device sync) and report the metrics every N steps, and "
                             "on the last, evaluated and saved steps; the step time reported is the mean since the "
                             f"last report (default: every step up to {EVERY_STEP_UP_TO} steps, else every "
                             f"{LOG_EVERY_LONG})")
    parser.add_argument("--share-gpu", action="store_true",
                        help="ranks share the GPUs (rank i on cuda:i %% GPUs; one GPU: all on cuda:0) over gloo, "
                             "every message staged through host memory: more ranks than GPUs, e.g. to test a "
                             "pipeline on one GPU (NCCL needs a GPU per rank); without CUDA the ranks run on the CPU")
    parser.add_argument("--timeout", type=float, default=60.0, help="process-group timeout in seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--dtype", choices=sorted(AUTOCAST), default="fp32",
                        help="fp32, or bf16: forwards and the loss under torch.autocast (weights stay fp32)")
    parser.add_argument("--batch-norm", choices=BATCH_NORM_MODES, default="micro",
                        help="train-mode BatchNorm: micro (statistics per data-parallel share, the default), deferred "
                             "(running statistics over the whole mini-batch) or sync (each micro-batch normalised "
                             "whole across the stage's ranks); deferred and sync need fx capture")
    parser.add_argument("--init", choices=INIT_MODES, default="model",
                        help="model: every rank builds the whole model with --seed; meta: ranks build it without "
                             "weights and initialise only their own stage (a seed per module name)")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="start from these weights (a .safetensors file or a torch.distributed.checkpoint "
                             "directory); each rank reads only its stage's tensors (implies --init meta)")


def _scheduler(args: argparse.Namespace) -> Any:
    """The rank's scheduler factory for `--lr-schedule` and `--warmup-steps` (None: a constant rate)."""
    if args.lr_schedule == "constant" and args.warmup_steps == 0:
        return None
    factor = lr_factor(args.lr_schedule, args.warmup_steps, args.steps)
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the training options, in one line, or None; `graphpipe train` checks this before
    it starts any process, a rank before it joins the group (both exit 2, like argparse)."""
    if args.steps < 1:
        return (f"--steps must be at least 1, got {args.steps}: it is the step to train up to (with --resume, "
                "counting the steps already done)")
    if args.resume and not args.checkpoint_dir:
        return "--resume needs --checkpoint-dir DIR, the directory the earlier run saved its step_N checkpoints in"
    if args.save_every < 0:
        return f"--save-every must be 0 (save only at the end) or more, got {args.save_every}"
    if args.save_every > 0 and not args.checkpoint_dir:
        return "--save-every needs --checkpoint-dir DIR to save into"
    if not 0 <= args.warmup_steps < args.steps:
        return (f"--warmup-steps must be at least 0 and fewer than --steps ({args.steps}), got {args.warmup_steps}")
    if args.clip_grad_norm is not None and not args.clip_grad_norm > 0:
        return f"--clip-grad-norm must be above 0 (the largest gradient norm kept), got {args.clip_grad_norm:g}"
    if args.log_every is not None and args.log_every < 1:
        return f"--log-every must be at least 1 (report every N steps), got {args.log_every}"
    if args.threads < 1:
        return f"--threads must be at least 1, got {args.threads}"
    if args.timeout <= 0:
        return f"--timeout must be above 0 seconds, got {args.timeout:g}"
    if not (math.isfinite(args.lr) and args.lr >= 0):
        return f"--lr must be a finite number of at least 0, got {args.lr:g}: give the optimizer's step size, e.g. 1e-3"
    for flag, spec in (("--data", args.data), ("--eval-data", args.eval_data)):
        if spec and not Path(spec.rsplit(":", 1)[0]).is_file():
            return f"{flag} {spec}: no such file; give path/to/data.py:factory"
    if args.eval_every < 0 or (args.eval_every and not args.eval_data):
        return (f"--eval-every {args.eval_every}: give a number of steps (0: only after the last) together with "
                "--eval-data FILE.py:factory")
    if args.accumulate < 1:
        return f"--accumulate must be at least 1 (mini-batches per optimizer step), got {args.accumulate}"
    if args.weights and not Path(args.weights).exists():
        return (f"--weights {args.weights} does not exist (give a .safetensors file or a torch.distributed.checkpoint "
                "directory)")
    problem = output_paths_problem(args.checkpoint_dir, args.trace)
    if problem or not hasattr(args, "nproc"):
        return problem
    # `graphpipe train` (its options have --nproc) checks the mini-batch it plans, the loss and --weights once,
    # before it starts the ranks; a rank leaves them to its own model building, which fails the same way
    from graphpipe.planner.api import micro_batch_count_problem
    from graphpipe.runtime.preflight import model_problem

    too_many = micro_batch_count_problem(args.batch, None) if args.batch and not args.plan else None
    return f"--mini-batch {args.batch}: {too_many}" if too_many else model_problem(args)


def cuda_devices_problem(ranks_here: int, share_gpu: bool = False) -> str | None:
    """Each rank of a machine takes one CUDA device (NCCL): more ranks than devices cannot start, unless they
    share the GPUs (--share-gpu: gloo, host-staged messages)."""
    if share_gpu or not torch.cuda.is_available() or ranks_here <= torch.cuda.device_count():
        return None
    count = torch.cuda.device_count()
    return (f"{ranks_here} ranks on this machine but it has {count} CUDA device(s), and each rank takes one over "
            f"NCCL: start at most {count} (--nproc {count}), or pass --share-gpu to put several ranks on a GPU (gloo, "
            "messages staged through host memory: slower, for testing a pipeline), or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=) to train on the CPU")


def log_every(args: argparse.Namespace) -> int:
    """Report (and sync the loss) every this many steps: --log-every, else every step of a short run."""
    if args.log_every is not None:
        return int(args.log_every)
    return 1 if args.steps <= EVERY_STEP_UP_TO else LOG_EVERY_LONG


def builds_empty(args: argparse.Namespace) -> bool:
    """Whether the model is built without parameter values (--init meta, or weights to load)."""
    return getattr(args, "init", "model") == "meta" or bool(getattr(args, "weights", None))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = train_args_problem(args)
    if problem:
        parser.error(problem)
    rank = int(os.environ.get("RANK", "0"))
    try:
        run(args)
    except GraphPipeError as err:
        print(f"graphpipe train: rank {rank}: error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    plan = Plan.load(args.plan)
    device = _init_process_group(args.timeout, args.share_gpu)
    zoo = _load_model(args, plan)
    trainer = _make_trainer(args, plan, zoo, device)
    if trainer.idle:  # the plan uses fewer ranks than were launched
        print(f"graphpipe train: rank {trainer.rank}: idle (the plan uses ranks 0-{plan.world_size - 1} of "
              f"{dist.get_world_size()})", file=sys.stderr, flush=True)
        return
    if args.resume and args.checkpoint_dir:
        _resume(trainer, args.checkpoint_dir)
    _train_loop(args, plan, trainer, zoo)


def _init_process_group(timeout_s: float, share_gpu: bool = False) -> torch.device:
    if "RANK" not in os.environ:
        raise TrainingError("python -m graphpipe.train runs under torchrun (RANK is not set); use "
                            "`graphpipe train --nproc N` or `torchrun --nproc-per-node N -m graphpipe.train ...`")
    use_cuda = torch.cuda.is_available()
    device = torch.device("cpu")
    problem = cuda_devices_problem(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), share_gpu)
    if problem:
        raise TrainingError(problem)
    if share_gpu:  # gloo between the ranks; the trainer stages their messages through host memory
        if use_cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        return device
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # NCCL: bind the rank to its GPU now (its communicators are created on it, not guessed from cuda:0)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout_s),
                            device_id=device if use_cuda else None)
    return device


def _load_model(args: argparse.Namespace, plan: Plan) -> Any:
    from graphpipe.models import load_model
    from graphpipe.models.user_factory import parse_model_options

    spec = dict(plan.model_spec)
    name = args.model or spec.get("model")
    if not name:
        raise TrainingError("no model: pass --model (the plan does not record which model it was made for)")
    options = {**dict(spec.get("options") or {}), **parse_model_options(args.model_options)}
    args.leaf_modules = args.leaf_modules or list(spec.get("leaf_modules") or ())
    return load_model(name, args.preset or spec.get("preset") or "tiny", batch_size=plan.global_batch_size,
                      device="cpu", seed=args.seed, empty=builds_empty(args), **options)


def _make_trainer(args: argparse.Namespace, plan: Plan, zoo: Any, device: torch.device) -> Any:
    from graphpipe.runtime.trainer import PipelineTrainer

    lr, optimizer = args.lr, OPTIMIZERS[args.optimizer]
    return PipelineTrainer(zoo.model, plan, optimizer=lambda ps: optimizer(ps, lr=lr), loss_fn=zoo.loss_fn,
                           schedule=args.schedule or plan.schedule, leaf_modules=args.leaf_modules,
                           example_inputs=zoo.inputs, device=device, autocast=AUTOCAST[args.dtype],
                           weights=args.weights, init_seed=args.seed, batch_norm=args.batch_norm,
                           clip_grad_norm=args.clip_grad_norm, lr_scheduler=_scheduler(args),
                           host_staged=True if args.share_gpu else None)


def _resume(trainer: Any, checkpoint_dir: str) -> None:
    """Load the newest intact checkpoint. Every rank checks every file, so all pick the same step;
    rank 0 says which newer steps it skipped and why."""
    from graphpipe.runtime.checkpoint import latest_intact

    chosen, damaged = latest_intact(checkpoint_dir)
    if chosen is None:
        found = f" ({'; '.join(damaged)})" if damaged else ""
        raise TrainingError(f"--resume: no intact checkpoint under {checkpoint_dir}{found}; train without --resume "
                            "to start from scratch")
    trainer.load(str(chosen))
    if dist.get_rank() == 0:
        said = (f"{'; '.join(damaged)}; resuming from {chosen.name}" if damaged
                else f"resumed from {chosen} (step {trainer.step_count})")
        print(f"graphpipe train: {said}", file=sys.stderr, flush=True)


def shuffled_batch(zoo: Any, seed: int, step: int) -> tuple[Any, Any]:
    """The example batch with its rows permuted by a generator seeded with (seed, step)."""
    size = zoo.batch_size
    perm = torch.randperm(size, generator=torch.Generator().manual_seed(seed * 1_000_003 + step))
    return _take(zoo.inputs, perm), _take(zoo.targets, perm)


def _take(value: Any, perm: torch.Tensor) -> Any:
    if isinstance(value, ModelInputs):
        return ModelInputs(args=_take(value.args, perm), kwargs=_take(dict(value.kwargs), perm))
    if isinstance(value, torch.Tensor):
        return value[perm] if value.dim() > 0 and value.shape[0] == perm.numel() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_take(item, perm) for item in value)
    if isinstance(value, dict):
        return {key: _take(item, perm) for key, item in value.items()}
    return value


def _train_loop(args: argparse.Namespace, plan: Plan, trainer: Any, zoo: Any) -> None:
    """Train up to --steps. The loss is summed over the ranks (a device sync) only on the steps that report
    (`_reports`); the step time reported is the mean over the steps since the previous report."""
    from graphpipe.runtime.metrics import StepMetrics

    rank = dist.get_rank()
    simulated = simulated_iteration_s(plan, zoo, trainer.schedule, args.leaf_modules, args.plan) if rank == 0 \
        else None
    bar = _progress(rank, trainer.step_count, args.steps)
    traced: list[Any] = []
    pending: list[Any] = []  # the steps' events since the last report, not resolved yet
    origin = time.monotonic()
    kill_rank, kill_step = _kill_point()
    data = _mini_batches(args, plan)
    evaluation = _eval_batches(args, plan, rank)
    every = log_every(args)
    since, timed = time.perf_counter(), 0  # the interval the next report's step time averages
    first = trainer.step_count  # a resumed run reports its first step too
    for step in range(first, args.steps):
        inputs, targets = data.at(step) if data is not None else _example_batches(zoo, args, step)
        if (rank, step) == (kill_rank, kill_step):
            os.kill(os.getpid(), signal.SIGKILL)
        rate = trainer.learning_rate
        reports = step == first or _reports(args, step + 1, every, bool(evaluation))
        loss = trainer.step(inputs, targets, reduce_loss=reports)
        timed += 1
        if args.trace:  # resolved at the next report, after its sync (on a GPU, CUDA events)
            pending.append(trainer.executor.recorded())
        if bar is not None and not reports:
            bar.update(1)
        if not reports:
            continue
        elapsed = (time.perf_counter() - since) / timed  # the loss's sum synchronised every rank's device
        traced += [resolve() for resolve in pending]
        pending = []
        peaks, reserved, outside = _gather_memory(trainer)
        evaluated = mean_eval_loss(trainer, evaluation) if evaluation and _should_eval(args, step + 1) else None
        metrics = StepMetrics(step=step + 1, loss=loss, iteration_s=elapsed,
                              samples_per_s=plan.global_batch_size * args.accumulate / elapsed,
                              simulated_iteration_s=simulated, peak_memory_bytes=peaks,
                              simulation_calibrated=simulation_calibrated(plan), grad_norm=trainer.last_grad_norm,
                              learning_rate=rate, eval_loss=evaluated, steps_timed=timed,
                              reserved_memory_bytes=reserved, outside_allocator_bytes=outside)
        if rank == 0:
            _report(args, bar, metrics)
        problem = None if trainer.idle else non_finite_problem(step + 1, loss, trainer.last_grad_norm,
                                                               args.checkpoint_dir)
        if problem:
            raise TrainingError(problem)
        if args.checkpoint_dir and _should_save(args, step + 1):
            trainer.save(str(Path(args.checkpoint_dir) / f"step_{step + 1}"))
        since, timed = time.perf_counter(), 0
    if bar is not None:
        bar.close()
    if args.trace:
        from graphpipe.runtime.trace import write_rank_trace

        traced += [resolve() for resolve in pending]
        write_rank_trace(args.trace, rank, trainer.stage_idx, traced, origin, trainer.executor.clock.source)


def _reports(args: argparse.Namespace, done: int, every: int, evaluating: bool) -> bool:
    """Whether step `done` sums the loss and reports: every `every` steps, the first and the last, and the steps
    that evaluate or save (a non-finite loss must stop training before its step is saved)."""
    return (done % every == 0 or done == 1 or done == args.steps or (evaluating and _should_eval(args, done))
            or bool(args.checkpoint_dir and _should_save(args, done)))


def _mini_batches(args: argparse.Namespace, plan: Plan) -> Any:
    """`--data` as mini-batches of the plan's size (the same on every rank), or None for the example batch."""
    if not args.data:
        return None
    from graphpipe.runtime.data import MiniBatches, load_data

    return MiniBatches(load_data(args.data, args.seed), plan.global_batch_size, args.seed, f"--data {args.data}",
                       accumulate=args.accumulate)


def _example_batches(zoo: Any, args: argparse.Namespace, step: int) -> tuple[Any, Any]:
    """The example batch, shuffled for this step (`--accumulate` k: k of them, each shuffled its own way)."""
    if args.accumulate == 1:
        return shuffled_batch(zoo, args.seed, step)
    from graphpipe.runtime.data import join_batches

    return join_batches([shuffled_batch(zoo, args.seed, step * args.accumulate + k) for k in range(args.accumulate)])


def _eval_batches(args: argparse.Namespace, plan: Plan, rank: int) -> list[tuple[Any, Any]]:
    """The whole mini-batches of `--eval-data` (none without it); rank 0 says what a last partial one left out."""
    if not args.eval_data:
        return []
    from graphpipe.runtime.data import eval_batches, load_data

    label = f"--eval-data {args.eval_data}"
    batches, left_out = eval_batches(load_data(args.eval_data, args.seed), plan.global_batch_size, label)
    if not batches:
        raise TrainingError(f"{label} holds no whole mini-batch of {plan.global_batch_size} samples (the plan's "
                            "size): give more validation samples")
    if left_out and rank == 0:
        print(f"graphpipe train: note: {label}: {left_out} samples beyond the last whole mini-batch of "
              f"{plan.global_batch_size} are not evaluated", file=sys.stderr, flush=True)
    return batches


def mean_eval_loss(trainer: Any, batches: list[tuple[Any, Any]]) -> float:
    """The mean of `trainer.evaluate` over the mini-batches, weighted by their samples (every rank of the plan
    runs it: the same value everywhere)."""
    from graphpipe.runtime.data import num_samples

    total = count = 0.0
    for inputs, targets in batches:
        size = num_samples(targets)
        total += trainer.evaluate(inputs, targets) * size
        count += size
    return total / count


def _should_eval(args: argparse.Namespace, done: int) -> bool:
    return bool(done == args.steps or (args.eval_every > 0 and done % args.eval_every == 0))


def non_finite_problem(step: int, loss: float, grad_norm: float | None, checkpoint_dir: str | None) -> str | None:
    """One line when the loss or the global gradient norm of `step` is not finite (every rank sees the same
    all-reduced values, so all stop together), before this step is saved; None when both are finite."""
    if math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm)):
        return None
    what = f"the loss is {loss:g}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm:g}"
    from graphpipe.runtime.checkpoint import latest_complete

    last = latest_complete(checkpoint_dir) if checkpoint_dir and Path(checkpoint_dir).is_dir() else None
    kept = f"the last checkpoint, {last}, is kept" if last else "no checkpoint was saved before it"
    return (f"step {step}: {what}: training stopped before saving this step ({kept}); a lower --lr, "
            "--clip-grad-norm or --warmup-steps may help")


def simulation_calibrated(plan: Plan) -> bool:
    """Whether the plan's simulated machine had its host costs measured (`Device.host_calibrated`): only then
    is its iteration a prediction of this run. The presets model a device's ops alone; on this 2-core machine
    they were 31-67% below and 36-43% above the measured iteration (`docs/results.md`)."""
    from graphpipe.cost.cluster import Cluster

    return bool(plan.cluster) and Cluster.from_dict(plan.cluster).device.host_calibrated


def simulated_iteration_s(plan: Plan, zoo: Any, schedule: Any, leaf_modules: Any,
                          plan_path: str | None = None) -> float | None:
    """The simulator's iteration time for the plan, with the costs it records (`Plan.cost_source`; the
    analytic model on the plan's cluster for a plan without), or None (also, silently, for a plan that
    records no cluster: one made by hand). A warning when those costs cannot be made again goes to stderr."""
    if not plan.cluster:
        return None
    try:
        from graphpipe.cost.cluster import Cluster
        from graphpipe.cost.sources import costs_as_recorded
        from graphpipe.graph.capture import capture
        from graphpipe.simulation.simulator import simulate

        cluster = Cluster.from_dict(plan.cluster)
        sizes = sorted({stage.micro_batch_size for stage in plan.stages})
        costs, _, warning = costs_as_recorded(
            plan.cost_source, lambda: capture(zoo.model, zoo.inputs, leaf_modules=leaf_modules or (),
                                              capture=plan.capture),
            cluster=cluster, label=f"plan {plan_path}" if plan_path else "the plan", near=plan_path,
            micro_batch_sizes=sizes)
        if warning:
            print(f"graphpipe train: warning: {warning}", file=sys.stderr)
        return float(simulate(plan, costs, cluster, schedule).iteration_time_s)
    except (GraphPipeError, ImportError, KeyError, TypeError) as err:
        print(f"graphpipe train: no simulated time ({type(err).__name__}: {err})", file=sys.stderr)
        return None


def _should_save(args: argparse.Namespace, done: int) -> bool:
    steps, save_every = int(args.steps), int(args.save_every)
    return done == steps or (save_every > 0 and done % save_every == 0)


def _kill_point() -> tuple[int, int]:
    text = os.environ.get(KILL_ENV, "")
    if not text:
        return -1, -1
    rank, _, step = text.partition(":")
    return int(rank), int(step)


def _gather_memory(trainer: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Every working rank's peak memory since the last report (`peak_memory_bytes` resets it) and, on CUDA, its
    allocator's reserved bytes and the device memory in use beyond them (`device_memory_bytes`; () on CPU).
    One all-reduce of a slot per rank into a tensor this rank owns (the output list of an all_gather could be
    freed by a gloo thread during interpreter shutdown), over the plan's ranks only: idle ranks have left."""
    from graphpipe.runtime.metrics import device_memory_bytes, peak_memory_bytes

    world = trainer.plan.world_size
    every = torch.zeros(3, world, dtype=torch.int64, device=trainer.device)
    own = [peak_memory_bytes(trainer.device), *device_memory_bytes(trainer.device)]
    every[:, trainer.rank] = torch.tensor(own, dtype=torch.int64, device=trainer.device)
    trainer.transport.all_reduce_sum_(every, tuple(range(world)))
    peaks, reserved, outside = (tuple(int(value) for value in row) for row in every.tolist())
    if trainer.device.type != "cuda":
        return peaks, (), ()
    return peaks, reserved, outside


def _progress(rank: int, start: int, total: int) -> Any:
    if rank != 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)


def _report(args: argparse.Namespace, bar: Any, metrics: Any) -> None:
    bar.set_postfix_str(metrics.short(), refresh=False)
    bar.update(metrics.step - bar.n)
    if args.metrics_out:
        with open(args.metrics_out, "a") as handle:
            handle.write(json.dumps(metrics.to_dict()) + "\n")


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)  # skip interpreter teardown, where gloo's threads may still release tensors
