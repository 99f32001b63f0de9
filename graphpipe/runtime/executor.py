"""Run one rank's action list for one mini-batch.

Micro-batch m of a stage holds samples [m*b, (m+1)*b) of the mini-batch and this rank
computes its contiguous share (see `graphpipe.runtime.lowering`). Sends and receives are
lowered into per-rank-pair pieces; each value crossing an edge is sent as its own tensor,
values in topological order within a piece. An edge of the plan that carries no tensor (a chain's link
between stages on different branches), or no gradient back, carries a one-element token instead, so that
its stages run in the order the schedule and the simulator give them. The first time a rank sends a value to a
peer rank it sends a small header (dtype and trailing shape) first, so receivers need no
shape inference; gradients travel without header (the receiver sent the activation).

Loss: the sink scales each micro-batch loss by (its samples / mini-batch samples), so the
sum over micro-batches and data-parallel ranks is the mean loss of the whole mini-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphpipe.errors import TrainingError
from graphpipe.runtime.action_clock import clock_for
from graphpipe.runtime.comm import ACTIVATIONS, GRADIENTS, RecvSpec, Transport
from graphpipe.runtime.grad_buckets import GradBuckets
from graphpipe.runtime.lowering import Piece, message_pieces, share
from graphpipe.runtime.shared_grads import SharedGrads
from graphpipe.runtime.split_backward import WeightGradWork, backward_input
from graphpipe.runtime.stage_module import MODEL_OUTPUT, StageModule
from graphpipe.schedule.action import Action, ActionKind
from graphpipe.stages.stage_graph import Plan

LossFn = Callable[[Any, Any], torch.Tensor]
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)
_HEADER_LEN = 16
_FORWARD_KINDS = frozenset({ActionKind.FORWARD, ActionKind.SEND_ACT, ActionKind.RECV_ACT})


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionEvent:
    """When one action ran on this rank (seconds on the monotonic clock; on a GPU, when the device ran it:
    `graphpipe.runtime.action_clock`)."""

    action: Action
    start_s: float
    end_s: float


@dataclass(slots=True)
class _MicroBatchState:
    received: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    grads: dict[str, list[tuple[int, int, torch.Tensor]]] = field(default_factory=dict)  # value -> (dst, start, g)
    loss: torch.Tensor | None = None
    weight_work: WeightGradWork | None = None  # a split backward's W, between its I and its W


class StageExecutor:
    """Executes a stage's schedule on one rank; keeps value metadata learned from headers across steps."""

    def __init__(self, *, plan: Plan, stage: StageModule, rank: int, transport: Transport, loss_fn: LossFn,
                 params: Sequence[torch.nn.Parameter] = (), on_step: Callable[[], None] | None = None,
                 autocast: torch.dtype | None = None, shared: SharedGrads | None = None,
                 overlap_grad_reduce: bool = True) -> None:
        self.plan = plan
        self.stage = stage
        self.spec = stage.spec
        self.rank = rank
        self.transport = transport
        self._token = torch.zeros(1, device=transport.device)  # what an edge without tensors carries
        self.loss_fn = loss_fn
        self.params = tuple(params)
        self.on_step = on_step  # the optimizer step: STEP runs it in its place in the schedule
        self.autocast = autocast  # forwards and the loss run under torch.autocast with this dtype
        self.shared = shared  # parameters other stages hold too: their gradients are summed over the plan
        named = dict(stage.named_parameters())
        self.shared_held = {name: named[name] for name in stage.spec.shared_params}
        held = {id(param) for param in self.shared_held.values()}
        self.local_params = tuple(param for param in self.params if id(param) not in held)
        self.stage_info = plan.stages[self.spec.stage_idx]
        # the data-parallel sum in buckets launched during the last backward (else: all of it after it)
        self.buckets = GradBuckets(self.local_params, self.stage_info.ranks, transport) \
            if overlap_grad_reduce and len(self.stage_info.ranks) > 1 and self.local_params else None
        # (peer, value) -> (dtype, trailing shape, rows per sample), from the header sent once per peer
        self._known: dict[tuple[int, str], tuple[torch.dtype, tuple[int, ...], int]] = {}
        self._sent_header: set[tuple[int, str]] = set()
        self.clock = clock_for(transport.device)  # CUDA events on a GPU: the kernels' time, not the launches'
        self._marks: list[tuple[Action, Any, Any]] = []  # (action, start mark, end mark) of the last run
        self._events: list[ActionEvent] | None = []
        self.loss_scale = 1.0  # 1 / the mini-batches a step accumulates: their gradients sum to the mean's
        self._outputs_kept: list[tuple[int, int, Any]] | None = None  # the sink's outputs, during run_forward
        self.handlers = self._dispatch_table()

    def _dispatch_table(self) -> dict[ActionKind, Callable[[Action], None]]:
        """What runs each action kind; `run` refuses a schedule with a kind that is missing here."""
        return {ActionKind.FORWARD: lambda a: self._forward(a.micro_batch),
                ActionKind.BACKWARD: lambda a: self._backward(a.micro_batch),
                ActionKind.INPUT_GRAD: lambda a: self._input_grad(a.micro_batch),
                ActionKind.WEIGHT_GRAD: lambda a: self._weight_grad(a.micro_batch),
                ActionKind.SEND_ACT: lambda a: self._send_act(a.micro_batch, a.peer),
                ActionKind.RECV_ACT: lambda a: self._recv_act(a.micro_batch, a.peer),
                ActionKind.SEND_GRAD: lambda a: self._send_grad(a.micro_batch, a.peer),
                ActionKind.RECV_GRAD: lambda a: self._recv_grad(a.micro_batch, a.peer),
                ActionKind.ALL_REDUCE: lambda a: self._all_reduce(),
                ActionKind.STEP: lambda a: self._step()}

    # ---- one mini-batch ----------------------------------------------------------------------
    def run(self, actions: Sequence[Action], data: Mapping[str, Any], targets: Any) -> torch.Tensor:
        """Run `actions`; returns this rank's share of the mini-batch loss (0 off the sink)."""
        self._check_handled(actions)
        self._data, self._targets = data, targets
        self._states: dict[int, _MicroBatchState] = {}
        self._local_loss = torch.zeros((), device=self.transport.device)
        marks: list[tuple[Action, Any, Any]] = []
        clock = self.clock
        self._marks, self._events = marks, None
        last_backward = _last_backward(actions)
        for index, action in enumerate(actions):
            start = clock.mark()
            if index == last_backward and self.buckets is not None:
                self.buckets.arm()
            self._run_guarded(action)
            marks.append((action, start, clock.mark()))
        self.transport.flush()
        return self._local_loss

    @property
    def events(self) -> list[ActionEvent]:
        """When each action of the last `run` ran; on a GPU resolving them waits for the step's kernels."""
        if self._events is None:
            self._events = self.recorded()()
        return self._events

    def recorded(self) -> Callable[[], list[ActionEvent]]:
        """The last run's events, resolved when called: on a GPU, called after a synchronisation the caller makes
        anyway, it waits for nothing."""
        marks, seconds = self._marks, self.clock.seconds
        return lambda: [ActionEvent(action=action, start_s=seconds(start), end_s=seconds(end))
                        for action, start, end in marks]

    def _run_guarded(self, action: Action) -> None:
        """Run one action; an unexpected error becomes one TrainingError that names the rank and the action."""
        try:
            self._run_action(action)
        except TrainingError:
            raise
        except Exception as err:
            raise TrainingError(f"rank {self.rank}: action {action} failed: {type(err).__name__}: {err}") from err

    def run_forward(self, actions: Sequence[Action], data: Mapping[str, Any], targets: Any,
                    keep_outputs: bool = False) -> tuple[torch.Tensor, list[tuple[int, int, Any]]]:
        """Forward only (evaluation): the forwards, sends and receives of `actions` in their order, without
        gradients. Returns this rank's share of the mini-batch loss and, with `keep_outputs` on the sink, its
        model outputs as (first sample, end sample, output). Without autograd a stage keeps only the values it
        sends, not the activations a backward would need.

        Deadlock-free because the training schedule is: dropping its backward actions only removes waits."""
        forward_only = [a for a in actions if a.kind in _FORWARD_KINDS]
        self._outputs_kept = [] if keep_outputs else None
        self._data, self._targets = data, targets
        self._states = {}
        self._local_loss = torch.zeros((), device=self.transport.device)
        try:
            with torch.no_grad():
                for action in forward_only:
                    self._run_guarded(action)
            self.transport.flush()
            return self._local_loss, self._outputs_kept or []
        finally:
            self._outputs_kept = None

    def release(self) -> None:
        """Drop what the last mini-batch left here (received activations, inputs, targets): a tensor a
        process group filled must not outlive it, or a backend thread may free it during interpreter teardown."""
        self._states = {}
        self._data, self._targets = {}, None

    def _check_handled(self, actions: Sequence[Action]) -> None:
        """Refuse before the first action (not midway, with peers waiting) a kind this executor cannot run, and a
        split backward on a recomputing stage (each half would run the forward again)."""
        for action in actions:
            if action.kind.half_of is not None and self.stage.recompute:
                raise TrainingError(f"rank {self.rank}: stage {self.spec.stage_idx} recomputes its forward, so it "
                                    f"cannot split its backward ({action}); use whole backwards (B) there")
            if action.kind not in self.handlers:
                raise TrainingError(f"rank {self.rank}: stage {self.spec.stage_idx} has no handler for action kind "
                                    f"{action.kind.name} ({action}); the executor runs "
                                    f"{', '.join(kind.name for kind in self.handlers)}")

    def _run_action(self, action: Action) -> None:
        self.handlers[action.kind](action)

    def _step(self) -> None:
        if self.on_step is not None:
            self.on_step()

    def _state(self, micro_batch: int) -> _MicroBatchState:
        return self._states.setdefault(micro_batch, _MicroBatchState())

    def _my_rows(self, micro_batch: int) -> tuple[int, int]:
        return share(self.stage_info, self.rank, micro_batch)

    def _state_of_sample(self, sample: int) -> tuple[int, _MicroBatchState]:
        micro_batch = sample // self.stage_info.micro_batch_size
        return micro_batch, self._state(micro_batch)

    # ---- compute -----------------------------------------------------------------------------
    def _forward(self, micro_batch: int) -> None:
        state = self._state(micro_batch)
        start, stop = self._my_rows(micro_batch)
        axes = self.spec.data_batch_axes
        data = {name: rows_of(self._data[name], start, stop, axes.get(name, 0)) for name in self.spec.data_inputs}
        for name in self.spec.inputs:
            pieces = sorted(state.received.pop(name, []), key=lambda item: item[0])
            rows = sum(t.shape[0] for _, t in pieces)
            if rows == 0 or rows % (stop - start):
                raise TrainingError(f"rank {self.rank}: stage {self.spec.stage_idx} forward {micro_batch} is missing "
                                    f"input {name!r}: the schedule has no receive for it before the forward")
            value = torch.cat([t for _, t in pieces]) if len(pieces) > 1 else pieces[0][1]
            if value.is_floating_point():
                value.requires_grad_(True)
            state.inputs[name] = value
        with self._precision():
            state.outputs = self.stage(data, state.inputs, samples=stop - start)
            if self.spec.is_sink:
                output = state.outputs.pop(MODEL_OUTPUT)
                loss = self._loss(output, rows_of(self._targets, start, stop), stop - start)
        if self.spec.is_sink:
            if self._outputs_kept is not None:
                self._outputs_kept.append((start, stop, output))
            loss = loss.float() if self.autocast is not None else loss  # a bf16 loss would sum coarsely
            state.loss = loss * ((stop - start) / self.plan.global_batch_size * self.loss_scale)
            self._local_loss = self._local_loss + state.loss.detach()

    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.transport.device.type, dtype=self.autocast)

    def _loss(self, output: Any, targets: Any, num_samples: int) -> torch.Tensor:
        """The loss of one share of a micro-batch. A loss that couples the samples of a batch (in-batch
        negatives, targets that index the batch) fails or changes meaning on a share: say so."""
        try:
            loss = self.loss_fn(output, targets)
        except Exception as err:
            raise TrainingError(
                f"rank {self.rank}: the loss failed on {num_samples} of the mini-batch's {self.plan.global_batch_size} "
                f"samples ({type(err).__name__}: {err}). The sink computes the loss on each micro-batch share; a loss "
                "that couples samples (contrastive, in-batch negatives, targets indexing the batch) needs a "
                "micro-batch equal to the mini-batch on one device (plan with micro_batch_sizes=[mini-batch]), "
                "or a per-sample loss") from err
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise TrainingError(f"rank {self.rank}: loss_fn must return a scalar tensor (the mean over the samples "
                                f"it gets), got {shape}")
        return loss

    def _backward(self, micro_batch: int) -> None:
        state = self._states[micro_batch]
        roots, grads = self._backward_roots(state)
        if roots:
            torch.autograd.backward(roots, grads)
        state.outputs = {}
        state.loss = None

    def _input_grad(self, micro_batch: int) -> None:
        """A split backward's I: the received values' gradients now, the W kept (`graphpipe.runtime.split_backward`)."""
        state = self._states[micro_batch]
        roots, grads = self._backward_roots(state)
        inputs = [value for value in state.inputs.values() if isinstance(value, torch.Tensor) and value.requires_grad]
        state.weight_work = backward_input(roots, grads, inputs, self.params) if roots else None
        state.outputs = {}
        state.loss = None

    def _weight_grad(self, micro_batch: int) -> None:
        state = self._states[micro_batch]
        if state.weight_work is not None:
            state.weight_work.run()
            state.weight_work = None

    def _backward_roots(self, state: _MicroBatchState) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """What a backward starts from: the sink's loss, and every output with the gradients its successors sent."""
        roots: list[torch.Tensor] = []
        grads: list[torch.Tensor | None] = []
        if state.loss is not None:
            roots.append(state.loss)
            grads.append(None)
        for name in self.spec.outputs:
            value = state.outputs.get(name)
            if not isinstance(value, torch.Tensor) or not value.requires_grad:
                continue
            grad = self._summed_grad(state, name, value)
            if grad is not None:
                roots.append(value)
                grads.append(grad)
        return roots, grads

    def _summed_grad(self, state: _MicroBatchState, name: str, value: torch.Tensor) -> torch.Tensor | None:
        """Gradients from every successor stage, each assembled from its pieces, then summed."""
        by_dst: dict[int, list[tuple[int, torch.Tensor]]] = {}
        for dst, start, grad in state.grads.pop(name, []):
            by_dst.setdefault(dst, []).append((start, grad))
        total: torch.Tensor | None = None
        for dst in sorted(by_dst):
            parts = [g for _, g in sorted(by_dst[dst], key=lambda item: item[0])]
            grad = torch.cat(parts) if len(parts) > 1 else parts[0]
            total = grad if total is None else total + grad
        if total is not None and total.shape != value.shape:
            raise TrainingError(f"rank {self.rank}: gradient of {name!r} has shape {tuple(total.shape)}, "
                                f"the value {tuple(value.shape)}")
        return total

    # ---- activations -------------------------------------------------------------------------
    # A receive action posts all its receives in one `recv_many` (headers first, in one call of their own: a
    # header gives the shape of what follows), so the sender sends an action's headers before its tensors.
    def _send_act(self, message: int, dst_stage: int) -> None:
        values = self.spec.sends.get(dst_stage, ())
        pieces = self._pieces(dst_stage, message)
        if not values:
            for piece in pieces:
                self.transport.send(self._token, piece.peer_rank, ACTIVATIONS)
            return
        slices = []
        for piece in pieces:
            micro_batch, state = self._state_of_sample(piece.start)
            offset, stop = self._my_rows(micro_batch)
            for name in values:
                tensor = _crossing_tensor(state.outputs.get(name), name, self.spec.stage_idx, dst_stage)
                per = _rows_per_sample(tensor, stop - offset, name)
                self._send_header(piece.peer_rank, name, tensor, per)
                slices.append((tensor.detach()[(piece.start - offset) * per:(piece.stop - offset) * per],
                               piece.peer_rank))
        for tensor, peer in slices:
            self.transport.send(tensor, peer, ACTIVATIONS)

    def _recv_act(self, message: int, src_stage: int) -> None:
        values = self.spec.recvs.get(src_stage, ())
        pieces = self._pieces(src_stage, message)
        if not values:
            self._recv_tokens([piece.peer_rank for piece in pieces])
            return
        self._recv_headers([(piece.peer_rank, name) for piece in pieces for name in values])
        specs: list[RecvSpec] = []
        slots = []
        for piece in pieces:
            _, state = self._state_of_sample(piece.start)
            for name in values:
                dtype, trailing, per = self._known[(piece.peer_rank, name)]
                specs.append((((piece.stop - piece.start) * per, *trailing), dtype, piece.peer_rank))
                slots.append((state, name, piece.start))
        for (state, name, start), tensor in zip(slots, self.transport.recv_many(specs, ACTIVATIONS)):
            state.received.setdefault(name, []).append((start, tensor))

    def _recv_tokens(self, peers: list[int]) -> None:
        self.transport.recv_many([(self._token.shape, self._token.dtype, peer) for peer in peers], ACTIVATIONS)

    # ---- gradients ---------------------------------------------------------------------------
    def _send_grad(self, message: int, src_stage: int) -> None:
        for piece in self._pieces(src_stage, message):
            micro_batch, state = self._state_of_sample(piece.start)
            offset, stop = self._my_rows(micro_batch)
            names = [name for name in self.spec.recvs.get(src_stage, ()) if state.inputs[name].is_floating_point()]
            if not names:
                self.transport.send(self._token, piece.peer_rank, GRADIENTS)
            for name in names:
                value = state.inputs[name]
                per = _rows_per_sample(value, stop - offset, name)
                grad = value.grad if value.grad is not None else torch.zeros_like(value)
                self.transport.send(grad[(piece.start - offset) * per:(piece.stop - offset) * per], piece.peer_rank,
                                    GRADIENTS)

    def _recv_grad(self, message: int, dst_stage: int) -> None:
        specs: list[RecvSpec] = []
        slots: list[tuple[_MicroBatchState, str, int] | None] = []  # None: a token
        for piece in self._pieces(dst_stage, message):
            micro_batch, state = self._state_of_sample(piece.start)
            offset, stop = self._my_rows(micro_batch)
            names = [name for name in self.spec.sends.get(dst_stage, ()) if _has_grad(state.outputs.get(name))]
            if not names:
                specs.append((self._token.shape, self._token.dtype, piece.peer_rank))
                slots.append(None)
            for name in names:
                value = state.outputs[name]
                per = _rows_per_sample(value, stop - offset, name)
                specs.append((((piece.stop - piece.start) * per, *value.shape[1:]), value.dtype, piece.peer_rank))
                slots.append((state, name, piece.start - offset))
        for slot, grad in zip(slots, self.transport.recv_many(specs, GRADIENTS)):
            if slot is not None:
                state, name, start = slot
                state.grads.setdefault(name, []).append((dst_stage, start, grad))

    def _all_reduce(self) -> None:
        self._data_parallel_all_reduce()
        if self.shared is not None:
            self.shared.all_reduce(self.shared_held, self.transport)

    def _data_parallel_all_reduce(self) -> None:
        ranks = self.stage_info.ranks
        if self.buckets is not None:
            self.buckets.finish()
            return
        if len(ranks) <= 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.local_params]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.transport.all_reduce_sum_(flat, ranks)
        pos = 0
        for param, grad in zip(self.local_params, grads):
            count = grad.numel()
            param.grad = flat[pos:pos + count].view_as(grad).clone()
            pos += count

    # ---- helpers -----------------------------------------------------------------------------
    def _pieces(self, peer_stage: int, message: int) -> list[Piece]:
        return message_pieces(self.plan, self.rank, self.spec.stage_idx, peer_stage, message)

    def _send_header(self, peer: int, name: str, tensor: torch.Tensor, rows_per_sample: int) -> None:
        """dtype, trailing shape and rows per sample (the last slot) of a value, once per peer."""
        if (peer, name) in self._sent_header:
            return
        header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
        header[0] = _DTYPES.index(tensor.dtype)
        header[1] = tensor.dim() - 1
        header[2:1 + tensor.dim()] = torch.tensor(tensor.shape[1:], dtype=torch.int64)
        header[-1] = rows_per_sample
        self.transport.send(header.to(self.transport.device), peer, ACTIVATIONS)
        self._sent_header.add((peer, name))

    def _recv_headers(self, keys: list[tuple[int, str]]) -> None:
        """Receive, in one call, the headers of the (peer, value) pairs not seen yet, in the order sent."""
        unknown = [key for key in dict.fromkeys(keys) if key not in self._known]
        if not unknown:
            return
        headers = self.transport.recv_many([((_HEADER_LEN,), torch.int64, peer) for peer, _ in unknown], ACTIVATIONS)
        for key, header in zip(unknown, headers):
            values = header.cpu().tolist()
            self._known[key] = (_DTYPES[values[0]], tuple(values[2:2 + values[1]]), values[-1])


def _last_backward(actions: Sequence[Action]) -> int | None:
    """The index of the step's last backward (or a split one's last W), where gradients become final (None in a
    list that does not reduce them: a mini-batch whose gradients only accumulate)."""
    if not any(action.kind == ActionKind.ALL_REDUCE for action in actions):
        return None
    return max((i for i, action in enumerate(actions) if action.kind.param_grads), default=None)


def _has_grad(value: Any) -> bool:
    """Whether a crossing value sends a gradient back (a floating-point tensor)."""
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def rows_of(value: Any, start: int, stop: int, axis: int | None = 0) -> Any:
    """Samples [start, stop) along `axis` of a tensor, or of every tensor in a tuple, list or dict;
    a value without a batch axis (None) is passed whole."""
    if axis is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.narrow(axis, start, stop - start)
    if isinstance(value, (tuple, list)):
        return type(value)(rows_of(item, start, stop, axis) for item in value)
    if isinstance(value, dict):
        return {key: rows_of(item, start, stop, axis) for key, item in value.items()}
    return value


def _rows_per_sample(tensor: torch.Tensor, samples: int, name: str) -> int:
    """Rows of a crossing value per sample: 1 for a batch-first tensor, the tokens per sample for one whose first
    dimension flattens the batch with the sequence (`[B*T, C]`: a mixture-of-experts layer's input)."""
    rows = tensor.shape[0]
    if rows == 0 or rows % samples:
        raise TrainingError(f"value {name!r} has {rows} rows for {samples} samples: a value crossing stages needs "
                            "the batch, or the batch flattened with other dimensions, first")
    return rows // samples


def _crossing_tensor(value: Any, name: str, src: int, dst: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TrainingError(f"value {name!r} crosses from stage {src} to stage {dst} but is a "
                            f"{type(value).__name__}, not a tensor; only batch-first tensors can cross stages: "
                            "plan its producer and readers into one stage")
    if value.dtype not in _DTYPES:
        raise TrainingError(f"value {name!r} has dtype {value.dtype}, which graphpipe cannot send")
    if value.dim() == 0 or value.dim() > _HEADER_LEN - 3:
        raise TrainingError(f"value {name!r} crossing stage {src} -> {dst} has shape {tuple(value.shape)}; "
                            "it needs a leading batch dimension")
    return value
