"""PipelineTrainer: train a planned stage graph, one process per rank, with single-device numerics.

Every rank builds the model (with the same seed, or with `graphpipe.empty_weights()`: no
parameter values at all), captures it the way the plan's graph was captured (fx or
torch.export, from `example_inputs`), and keeps the stage its rank belongs to, giving values
to that stage's parameters only when they were left empty; the optimizer only sees that
stage's parameters. One `step` runs the rank's action list for the mini-batch (for each of several
mini-batches, only the last all-reducing and stepping), all-reduces gradients inside the stage's
data-parallel group, steps the optimizer once, and returns the mini-batch mean loss on every rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, overload

import torch
import torch.distributed as dist
from torch import nn

from graphpipe.errors import GraphCaptureError, ScheduleError, TrainingError
from graphpipe.graph.capture import CapturedModule, capture_module
from graphpipe.graph.devices import place_graph_on
from graphpipe.graph.fingerprint import difference, structure_of
from graphpipe.graph.prune import prune_graph
from graphpipe.graph.tracer import trace_module
from graphpipe.meta_weights import has_meta_tensors
from graphpipe.runtime.batch_norm import prepare_batch_norm
from graphpipe.runtime.checkpoint import load_stage, save_stage
from graphpipe.runtime.comm import CHANNELS, DistTransport, Transport
from graphpipe.runtime.eval_mode import eval_mode
from graphpipe.runtime.eval_outputs import assemble_outputs
from graphpipe.runtime.executor import LossFn, StageExecutor, rows_of
from graphpipe.runtime.gather_state import gather_state, held_tensors, in_model_order
from graphpipe.runtime.grad_clip import clip_global_grad_norm_
from graphpipe.runtime.host_staging import HOST, HostStagedTransport, pins_host_buffers
from graphpipe.runtime.materialize import materialize
from graphpipe.runtime.model_keys import model_keys
from graphpipe.runtime.shared_grads import SharedGrads
from graphpipe.runtime.stage_module import StageModule, split_stages
from graphpipe.schedule.action import Action, ActionKind
from graphpipe.schedule.schedule import Schedule
from graphpipe.stages.stage_graph import Plan

__all__ = ["PipelineTrainer"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]  # e.g. lambda opt: torch.optim.lr_scheduler.LambdaLR(...)


class PipelineTrainer:
    """Runs this rank's stage of `plan`; `step(inputs, targets) -> float` trains one mini-batch.

    `transport` and `rank` replace torch.distributed (single-process tests with an
    `InMemoryHub`); otherwise a process group must be initialised with at least the plan's
    world size. Ranks beyond it are *idle*: they take no stage (a plan may use fewer devices
    than there are), `step` returns nan on them at once and they hold no parameters, so a
    script can let them run its loop or leave. Data-parallel groups (and, with idle ranks or on gloo,
    the group of the plan's ranks) are created on every rank in the same order. `example_inputs` (one batch, as given to
    `gp.capture`) is needed for a plan captured with torch.export or from keyword or partial
    inputs; without it the model is traced with fx, one input per forward argument.
    `autocast=torch.bfloat16` runs forwards and the loss under `torch.autocast` (weights, gradients
    and optimizer state stay in the model's dtype; activations and messages are bfloat16).
    `clip_grad_norm=c` scales the gradients of every step so that their global norm (over every stage and
    replica, a shared weight once) is at most c, as `torch.nn.utils.clip_grad_norm_` on one device
    (`graphpipe.runtime.grad_clip`); `last_grad_norm` is that norm before clipping. `lr_scheduler` makes a
    `torch.optim.lr_scheduler` for each rank's optimizer (`lambda opt: CosineAnnealingLR(opt, T_max=...)`),
    stepped after every optimizer step and saved in checkpoints, so every stage follows one schedule.
    `step` given k times the plan's mini-batch accumulates the gradients of its k mini-batches into one optimizer
    step (one device's step on all of them); `evaluate` runs the forwards alone, in eval mode;
    `consolidated_state_dict()` gives every rank the whole model's `state_dict`.
    Ranks that share a GPU (a gloo group and a CUDA `device`) stage every message and collective through host
    memory (`graphpipe.runtime.host_staging`); `host_staged=True` does so on any device (on the CPU: a test of
    that path), False refuses it.
    A data-parallel stage sums its gradients in buckets launched during the last backward
    (`graphpipe.runtime.grad_buckets`; `overlap_grad_reduce=False`: all of them after it; off with
    `batch_norm="sync"`, whose collectives share the stage's group inside the backward).
    `close()` (or `with PipelineTrainer(...) as trainer:`) ends training cleanly; see there. A plan that records
    its graph (`Plan.graph_fingerprint`) is checked against this rank's capture, op for op; a plan captured at
    one sample (`export-static`) runs each share sample by sample (`graphpipe.runtime.per_sample`).
    """

    closed = False  # set by close(): step refuses to run after it
    _owns_groups = False  # the transport's process groups were made here: close() destroys them

    def __init__(self, model: nn.Module, plan: Plan, *, optimizer: OptimizerFactory, loss_fn: LossFn,
                 schedule: str | Schedule = "1f1b", leaf_modules: Iterable[type | str] = (),
                 example_inputs: Any = None, device: torch.device | str | None = None, process_group: Any = None,
                 transport: Transport | None = None, rank: int | None = None,
                 autocast: torch.dtype | None = None, batch_norm: str = "micro",
                 weights: str | os.PathLike[str] | None = None, init_seed: int = 0,
                 clip_grad_norm: float | None = None, lr_scheduler: SchedulerFactory | None = None,
                 overlap_grad_reduce: bool = True, host_staged: bool | None = None) -> None:
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise TrainingError(f"clip_grad_norm must be above 0 (the largest gradient norm kept), "
                                f"got {clip_grad_norm}")
        self.plan = plan
        self.clip_grad_norm = clip_grad_norm
        self.last_grad_norm: float | None = None  # the global gradient norm of the last step, where clipped
        self.device = torch.device(device) if device is not None else _default_device()
        if transport is None:
            transport, rank = self._dist_transport(process_group, host_staged)
        assert rank is not None, "pass rank= together with transport="
        self.rank = rank
        self.transport = transport
        self.step_count = 0
        self.idle = rank >= plan.world_size
        if self.idle:
            return
        self.stage_info = plan.stage_of_rank(rank)
        self.captured = _capture(model, plan, example_inputs, leaf_modules)
        traced = self.captured.module if isinstance(self.captured, CapturedModule) else self.captured
        _check_same_graph(plan, traced, model)
        self.input_names = tuple(node.name for node in traced.graph.nodes if node.op == "placeholder")
        stages = split_stages(self.captured, plan)
        self.stage: StageModule = stages[self.stage_info.idx]
        self.held = held_tensors(stages)  # every stage's tensors: what consolidated_state_dict gathers
        self.model_keys = model_keys(model)  # what the model's own state_dict holds: checkpoints record it
        self._materialize(model, traced, weights, init_seed)
        self.stage.module.to(self.device)
        place_graph_on(self.stage.module, self.device)  # the tensors its ops create, on the rank's device too
        self.schedule = _make_schedule(plan, schedule)
        self.batch_norm = prepare_batch_norm(self.stage, batch_norm, transport=transport,
                                             dp_ranks=tuple(self.stage_info.ranks))
        self.actions: tuple[Action, ...] = self.schedule.for_stage(self.stage_info.idx)
        # a mini-batch whose gradients only add up (all but the last of an accumulating step): no all-reduce, no step
        self._accumulating_actions = tuple(a for a in self.actions
                                           if a.kind not in (ActionKind.ALL_REDUCE, ActionKind.STEP))
        if [a.kind for a in self.actions].count(ActionKind.STEP) != 1:
            raise ScheduleError(f"stage {self.stage_info.idx}'s action list must hold exactly one STEP (after AR); "
                                "regenerate the schedule")
        params = [param for _, param in self.stage.named_parameters()]
        # a stage without parameters (a parameter-free merge, say) has nothing to optimise
        self.optimizer: torch.optim.Optimizer | None = optimizer(params) if params else None
        self.lr_scheduler: Any = lr_scheduler(self.optimizer) \
            if lr_scheduler is not None and self.optimizer is not None else None
        shared_names = {name for stage in stages for name in stage.spec.shared_params}
        # a checkpoint stores each shared parameter once, in the file of the first stage that holds it
        self.shared_owner = {name: min(stage.spec.stage_idx for stage in stages if name in stage.spec.shared_params)
                             for name in shared_names}
        shared = SharedGrads.of(stages, plan) if shared_names else None
        if shared is not None and (groups := _dist_transport_of(transport)) is not None:
            groups.add_groups(shared.groups(), among=self.rank)
        self.executor = StageExecutor(plan=plan, stage=self.stage, rank=rank, transport=transport,
                                      loss_fn=loss_fn, params=params, on_step=self._optimizer_step, autocast=autocast,
                                      shared=shared, overlap_grad_reduce=overlap_grad_reduce and batch_norm != "sync")

    def _materialize(self, model: nn.Module, traced: nn.Module, weights: str | os.PathLike[str] | None,
                     seed: int) -> None:
        """Give this stage's meta tensors values (or read them all from `weights`); other stages' stay meta."""
        if weights is None and not has_meta_tensors(self.stage.module):
            return
        module = self.stage.module
        names = [name for name, _ in (*module.named_parameters(remove_duplicate=False),
                                      *module.named_buffers(remove_duplicate=False))]
        materialize(model, names=names, seed=seed, weights=weights, into=(module, traced))

    def _dist_transport(self, process_group: Any, host_staged: bool | None) -> tuple[Transport, int]:
        if not dist.is_initialized():
            raise TrainingError("PipelineTrainer needs an initialised process group: run under torchrun, or call "
                                "torch.distributed.init_process_group first")
        world = dist.get_world_size(process_group)
        if world < self.plan.world_size:
            raise TrainingError(f"the plan was made for {self.plan.world_size} ranks but the process group has "
                                f"{world}; re-plan for {world} devices or launch {self.plan.world_size} processes")
        if process_group is not None and world != dist.get_world_size():
            raise TrainingError("PipelineTrainer runs on the whole world; a process group smaller than the world "
                                f"({world} of {dist.get_world_size()} ranks) is not supported")
        groups: dict[tuple[int, ...], Any] = {}
        for stage in self.plan.stages:  # every rank creates every group, in the same order
            if len(stage.ranks) > 1:
                groups[tuple(stage.ranks)] = dist.new_group(list(stage.ranks))
        working = tuple(range(self.plan.world_size))
        # The loss and barriers of the plan's ranks leave idle ranks out, and on gloo the default group too: its
        # threads outlive destroy_process_group() while anything refers to it (torch.distributed.nn's default
        # arguments do once torch.optim imports torch._dynamo) and could still be releasing the last loss tensor
        # during interpreter teardown (SIGABRT); close() destroys this group, which ends its threads.
        if working not in groups and (world > self.plan.world_size or dist.get_backend() == "gloo"):
            groups[working] = dist.new_group(list(working))  # the same branch on every rank: same order
        # NCCL: a communicator per p2p channel (activations, gradients), apart from the collectives' (comm.py)
        p2p_groups = [dist.new_group(list(range(world))) for _ in CHANNELS] if dist.get_backend() == "nccl" else []
        self._owns_groups = True
        dist.barrier()  # NCCL: the first batched point-to-point call must not be the group's first call
        if not _stages_through_host(self.device, host_staged):
            return DistTransport(device=self.device, groups=groups, p2p_groups=p2p_groups), dist.get_rank()
        on_host = DistTransport(device=HOST, groups=groups, pin_memory=pins_host_buffers(self.device))
        return HostStagedTransport(on_host, self.device), dist.get_rank()

    # ---- training ----------------------------------------------------------------------------
    @overload
    def step(self, inputs: Any, targets: Any) -> float: ...

    @overload
    def step(self, inputs: Any, targets: Any, *, reduce_loss: bool) -> float | None: ...

    def step(self, inputs: Any, targets: Any, *, reduce_loss: bool = True) -> float | None:
        """Train on one mini-batch (batch first, every rank passes the same batch); the mean loss on every rank
        (nan on an idle rank, at once). `reduce_loss=False` returns None and skips the loss's sum over the
        ranks and the host's wait for it: a loop that reads the loss only now and then saves a collective and
        a device sync per step."""
        if self.closed:
            raise TrainingError(f"rank {self.rank}: step after close(); make a new PipelineTrainer to train again")
        if self.idle:
            return float("nan")
        data, passes = self._named_inputs(inputs)
        targets = self._sink_targets(targets)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.executor.loss_scale = 1.0 / passes
        local = torch.zeros((), device=self.device)
        for index in range(passes):  # gradients add up; the all-reduce and the optimizer step come last
            actions = self.actions if index == passes - 1 else self._accumulating_actions
            local = local + self.executor.run(actions, *self._pass_batch(data, targets, index))
        self.step_count += 1
        return self._plan_sum(local) if reduce_loss else None

    def evaluate(self, inputs: Any, targets: Any, *, return_outputs: bool = False) -> Any:
        """The mean loss of `loss_fn` over a mini-batch (or several: any multiple of the plan's size), run
        forward only: every module in eval mode (dropout off, BatchNorm's running statistics), no gradients, no
        activations kept, parameters untouched. With `return_outputs`, `(loss, outputs)`: the model's outputs
        for every sample, in order, on the ranks of the sink stage (None on the others). nan on an idle rank."""
        if self.closed:
            raise TrainingError(f"rank {self.rank}: evaluate after close(); make a new PipelineTrainer")
        if self.idle:
            return (float("nan"), None) if return_outputs else float("nan")
        data, passes = self._named_inputs(inputs)
        targets = self._sink_targets(targets)
        self.executor.loss_scale = 1.0 / passes
        local, pieces = torch.zeros((), device=self.device), []
        with eval_mode(self.stage.module):
            for index in range(passes):
                loss, kept = self.executor.run_forward(self.actions, *self._pass_batch(data, targets, index),
                                                       keep_outputs=return_outputs)
                local = local + loss
                offset = index * self.plan.global_batch_size
                pieces += [(start + offset, stop + offset, output) for start, stop, output in kept]
        loss_value = self._plan_sum(local)
        if not return_outputs:
            return loss_value
        outputs = assemble_outputs(pieces, passes * self.plan.global_batch_size, self.transport,
                                   tuple(self.stage_info.ranks)) if self.stage.spec.is_sink else None
        return loss_value, outputs

    def _plan_sum(self, local: torch.Tensor) -> float:
        """The sum of every plan rank's loss share, in float64 (the sink's loss has the model's dtype, the other
        ranks' zeros do not)."""
        total = local.detach().reshape(1).to(self.device, torch.float64, copy=True)
        self.transport.all_reduce_sum_(total, tuple(range(self.plan.world_size)))
        return float(total.item())

    def _sink_targets(self, targets: Any) -> Any:
        """The targets on this rank's device, moved once a step, where the rank computes the loss (None elsewhere)."""
        return _to(targets, self.device) if self.stage.spec.is_sink else None

    def _pass_batch(self, data: dict[str, Any], targets: Any, index: int) -> tuple[dict[str, Any], Any]:
        """The inputs and (on the sink) targets of the index-th of the plan's mini-batches in the batch (both
        already on this rank's device)."""
        batch = self.plan.global_batch_size
        rows = (index * batch, (index + 1) * batch)
        inputs = {name: rows_of(value, *rows, self.plan.input_batch_axes.get(name, 0)) for name, value in data.items()}
        return inputs, rows_of(targets, *rows) if self.stage.spec.is_sink else None

    def consolidated_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole trained model's `state_dict`, on the CPU, under the model's own names and in its order (a
        tied name shares its tensor), for `model.load_state_dict` on one device. Every rank of the plan must call
        it (it is one all-reduce per dtype) and gets the whole model; an idle rank gets {}. A parameter the
        forward never reads is held by no stage, never trained, and left out (load with strict=False)."""
        if self.idle:
            return {}
        provides = self.stage_idx if self.is_stage_leader else None
        gathered = gather_state(self.held, self.state_dict(), provides, self.transport,
                                tuple(range(self.plan.world_size)), self.device)
        return in_model_order(gathered, self.model_keys)

    def _named_inputs(self, inputs: Any) -> tuple[dict[str, Any], int]:
        """This stage's model inputs, by name, on its device, and how many of the plan's mini-batches they hold
        (more than one: their gradients accumulate into one step)."""
        if isinstance(self.captured, CapturedModule):
            try:
                named = self.captured.bind(inputs)
            except GraphCaptureError as err:
                raise TrainingError(str(err)) from err
        else:
            values = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
            if len(values) != len(self.input_names):
                raise TrainingError(f"the model takes {len(self.input_names)} inputs "
                                    f"({', '.join(self.input_names)}), step got {len(values)}")
            named = dict(zip(self.input_names, values))
        batch = self.plan.global_batch_size
        sizes = {name: value.shape[axis] for name, value in named.items()
                 if isinstance(value, torch.Tensor) and (axis := self.plan.input_batch_axes.get(name, 0)) is not None}
        for name, size in sizes.items():
            if size == 0 or size % batch or size != max(sizes.values()):
                raise TrainingError(f"the plan trains mini-batches of {batch} samples, got input {name!r} with "
                                    f"{size} (inputs: {sizes}); pass {batch} samples per input, or a multiple of "
                                    f"{batch} to accumulate the gradients of several mini-batches in one step")
        wanted = set(self.stage.spec.data_inputs)
        passes = max(sizes.values(), default=batch) // batch
        return {name: _to(value, self.device) for name, value in named.items() if name in wanted}, passes

    def _optimizer_step(self) -> None:
        self.batch_norm.commit()
        if self.clip_grad_norm is not None:
            self.last_grad_norm = clip_global_grad_norm_(self._counted_params(), self.executor.params,
                                                         self.clip_grad_norm, self.transport,
                                                         tuple(range(self.plan.world_size)), self.device)
        if self.optimizer is not None:
            self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    @property
    def learning_rate(self) -> float | None:
        """The learning rate the next step uses (its first parameter group's); None without parameters."""
        return float(self.optimizer.param_groups[0]["lr"]) if not self.idle and self.optimizer is not None else None

    def _counted_params(self) -> list[nn.Parameter]:
        """The parameters whose gradients this rank adds to the global norm, so that each counts once: the
        stage leader's (its data-parallel replicas hold the same all-reduced gradients), a shared parameter
        only on its owner stage (`shared_owner`: every holder has the same summed gradient)."""
        if not self.is_stage_leader:
            return []
        return [param for name, param in self.stage.named_parameters()
                if self.shared_owner.get(name, self.stage_idx) == self.stage_idx]

    # ---- this rank's stage -------------------------------------------------------------------
    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's stage parameters under the model's original names (none on an idle rank)."""
        if not self.idle:
            yield from self.stage.named_parameters()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers of this rank's stage under the model's original names."""
        if self.idle:
            return {}
        state = {name: param.detach() for name, param in self.stage.named_parameters()}
        state.update({name: buffer.detach() for name, buffer in self.stage.named_buffers()})
        return state

    @property
    def stage_idx(self) -> int:
        """This rank's stage (-1 on an idle rank)."""
        return -1 if self.idle else self.stage_info.idx

    @property
    def is_stage_leader(self) -> bool:
        return not self.idle and self.rank == self.stage_info.ranks[0]

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self, directory: str) -> None:
        """Write this step's checkpoint into `directory`; the `complete` marker comes last."""
        if not self.idle:
            save_stage(directory, self, barrier=self.barrier)

    def load(self, directory: str) -> None:
        """Restore parameters, optimizer state and step count from a complete checkpoint."""
        if not self.idle:
            load_stage(directory, self)

    def barrier(self) -> None:
        """Wait for every rank of the plan (idle ranks take no part)."""
        if self.idle:
            return
        token = torch.zeros(1, device=self.device)
        self.transport.all_reduce_sum_(token, tuple(range(self.plan.world_size)))
        self.transport.flush()

    # ---- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for this rank's posted sends, drop the tensors the last step left and destroy the process
        groups this trainer created, which ends the threads that handled its tensors while the interpreter is
        whole: a gloo thread still releasing one during interpreter teardown aborts the process after correct
        results. The default group is the caller's: call `torch.distributed.destroy_process_group()` after
        close(). Idempotent; `step` fails after it."""
        self._close(wait=True)

    def __enter__(self) -> PipelineTrainer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._close(wait=exc_type is None)  # after a failure a peer may be gone: its receives never come

    def _close(self, *, wait: bool) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if wait:
                self.transport.flush()
        finally:
            if not self.idle:
                self.executor.release()
            if self._owns_groups and (groups := _dist_transport_of(self.transport)) is not None:
                groups.destroy_groups()


def _capture(model: nn.Module, plan: Plan, example_inputs: Any,
             leaf_modules: Iterable[type | str]) -> CapturedModule | torch.fx.GraphModule:
    """The model captured as the plan's graph was: the same method, so the same op names."""
    if example_inputs is not None:
        try:
            return capture_module(model, example_inputs, leaf_modules=leaf_modules, method=plan.capture,
                                  with_graph=False)
        except GraphCaptureError as err:
            raise TrainingError(f"capturing the model for training failed: {err}") from err
    if plan.capture in ("export", "export-static"):
        raise TrainingError("the plan's graph was captured with torch.export; pass example_inputs= (one batch, "
                            "as given to graphpipe.capture) so the model is captured the same way")
    return prune_graph(trace_module(model, leaf_modules))


def _check_same_graph(plan: Plan, traced: torch.fx.GraphModule, model: nn.Module) -> None:
    """TrainingError, in one line, unless this rank captured op for op the graph the plan partitions."""
    if plan.graph_fingerprint is None:  # a plan made by hand: `split_stages` checks what it can
        return
    where = difference(plan.graph_fingerprint, structure_of(traced, model))
    if where is not None:
        raise TrainingError(f"this model's graph is not the one the plan was made for: {where}; plan this model "
                            f"(graphpipe plan --model ...), or train the model the plan names ({plan.graph_name})")


def _make_schedule(plan: Plan, schedule: str | Schedule) -> Schedule:
    if isinstance(schedule, Schedule):
        return schedule
    from graphpipe.schedule.generate import make_schedule

    return make_schedule(plan, schedule)


def _stages_through_host(device: torch.device, host_staged: bool | None) -> bool:
    """Whether this rank's messages and collectives go through host memory (`graphpipe.runtime.host_staging`):
    as asked, else exactly when gloo would have to move the tensors of a CUDA device (ranks sharing a GPU)."""
    backend = dist.get_backend()
    if host_staged and backend != "gloo":
        raise TrainingError(f"host_staged=True stages messages through host memory over gloo; this process group "
                            f"runs {backend}: init_process_group('gloo') for ranks that share a GPU")
    if host_staged is False and backend == "gloo" and device.type == "cuda":
        raise TrainingError(f"gloo moves host memory only, and this rank computes on {device}: leave host_staged "
                            "unset (or True) to stage messages through host memory, or use NCCL, one GPU per rank")
    return bool(host_staged) if host_staged is not None else (backend == "gloo" and device.type == "cuda")


def _dist_transport_of(transport: Transport) -> DistTransport | None:
    """The torch.distributed transport that owns the process groups (inside a host-staged one), if any."""
    inner = transport.inner if isinstance(transport, HostStagedTransport) else transport
    return inner if isinstance(inner, DistTransport) else None


def _default_device() -> torch.device:
    """NCCL: the rank's own GPU, `LOCAL_RANK` (set by torchrun) where given, made current, so a script that
    forgot `torch.cuda.set_device` does not put every rank on cuda:0; gloo: the CPU."""
    if not (dist.is_initialized() and dist.get_backend() == "nccl"):
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    device = torch.device("cuda", int(local) if local is not None else torch.cuda.current_device())
    torch.cuda.set_device(device)
    return device


def _to(value: Any, device: torch.device) -> Any:
    """`value`'s tensors on `device`; host tensors go to a GPU from pinned memory without blocking the host (the
    copy is ordered before the kernels that read it on the same stream)."""
    if isinstance(value, torch.Tensor):
        if device.type == "cuda" and value.device.type == "cpu":
            return value.pin_memory().to(device, non_blocking=True)
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(item, device) for item in value)
    if isinstance(value, dict):
        return {key: _to(item, device) for key, item in value.items()}
    return value

