"""Measured costs: time every op's forward and backward in isolation, per micro-batch size.

For each micro-batch size the traced model runs once (an fx Interpreter, no gradients)
on a slice or repeat of the example inputs. When it reaches an op, the op is run on
fresh copies of its recorded inputs: `warmup` untimed calls, then `repeats` timed
forwards each followed by a timed backward (`torch.autograd.grad` with respect to the
inputs that need a gradient in training and the op's own parameters), and the median is
kept. The fixed cost of one `autograd.grad` call, which a whole-model backward pays once,
is measured up front and taken off every backward. The activations the op keeps for backward are measured once with
`saved_tensors_hooks`, summing the unique storages saved (parameters excluded).

On CUDA the times are the device's, between two `torch.cuda.Event`s around the call (what the kernels
take, not their launches); on the CPU the host's wall time.

An op timed alone is not an op in a pass: its inputs and weights are hot in cache, and a backward of one op
pays per op what one engine pass over the model pays once. On the CPU the sums of the ops' times are 20-60%
off the model's own pass either way (a model of many narrow ops sums higher, one of wide matmuls lower). So
each size's whole forward (the traced module called) and backward (one `autograd.grad` over every trainable
weight) are timed too, and the ops' forward and backward times are scaled, each pass apart, to sum to them
(`whole_pass=False` keeps the ops' own times; so does a size whose whole pass does not fit in memory): a
stage's share keeps the profile's shape, and the whole model's time is what it runs.

The model is profiled in training mode; its mode, buffers (e.g. BatchNorm statistics),
gradients and the global RNG state are left as they were.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import operator
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn

from graphpipe.cost.analytic import check_micro_batch_sizes
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.cost.flops import trainable_param_bytes
from graphpipe.errors import CostError
from graphpipe.graph.op_graph import OpGraph

__all__ = ["OpTimer", "Spread", "batch_of", "inputs_like", "profile", "tensors_in"]

TIMED_KINDS = frozenset({"call_module", "call_function", "call_method"})
Inputs = tuple[tuple[Any, ...], dict[str, Any], list[torch.Tensor]]  # args, kwargs, tensors to differentiate


def profile(graph: OpGraph, model: nn.Module, micro_batch_sizes: Sequence[int], *,
            example_inputs: Any = None, device: str = "cpu", warmup: int = 2, repeats: int = 5,
            leaf_modules: Iterable[type | str] = (), progress: bool = True,
            num_threads: int | None = None, whole_pass: bool = True) -> CostTable:
    """A measured cost table (source "measured") for `graph`, captured from `model` with the same leaf modules.

    `example_inputs` (batch first) are sliced or repeated to each micro-batch size; without
    them, inputs are made from the graph's input shapes (random floats, zero indices).
    `num_threads` sets torch's CPU threads while profiling (1 = one worker process's view). With `whole_pass`
    each size's op times are scaled, forward and backward apart, to sum to the whole model's pass as a stage
    runs it (see the module docstring); without it they are the ops' times alone.
    """
    sizes = check_micro_batch_sizes(micro_batch_sizes)
    if warmup < 0 or repeats < 1:
        raise CostError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    target = _torch_device(device)
    model = _on_device(model, target)
    gm, example_inputs = _traced_like(graph, model, example_inputs, tuple(leaf_modules))
    _check_same_ops(graph, gm)
    num_timed = sum(node.op in TIMED_KINDS for node in gm.graph.nodes)
    per_size: dict[int, dict[str, OpCost]] = {}
    spreads = []
    with _preserved(model, target, num_threads), _progress_bar(len(sizes) * num_timed, progress) as bar:
        timer = OpTimer(target, warmup=warmup, repeats=repeats, skip_storages=_storage_ptrs(model))
        for size in sizes:
            inputs = batch_of(example_inputs, size, target)
            timer.spread.clear()
            per_size[size] = _OpProfiler(gm, timer, bar, size).profile(inputs)
            spreads.append(timer.spread.relative())
            whole = timer.whole_pass_ms(gm, inputs) if whole_pass else None
            if whole is not None:
                per_size[size] = _summing_to(per_size[size], whole)
    entries = {op.name: {size: _with_params(per_size[size][op.name], trainable_param_bytes(op)) for size in sizes}
               for op in graph.ops}
    return CostTable(device=_device_name(target), source="measured", entries=entries, spread=max(spreads))


class Spread:
    """How much the timed runs of the ops disagree: the sum over ops of each op's interquartile range of its
    forward-plus-backward times, over the sum of their medians. The runs of one op are seconds apart, so
    another process waking up meanwhile shows here (a quiet machine: a few percent)."""

    def __init__(self) -> None:
        self.iqr_ms = 0.0
        self.median_ms = 0.0

    def add(self, times_ms: Sequence[float]) -> None:
        if len(times_ms) >= 2:
            low, _, high = statistics.quantiles(times_ms, n=4, method="inclusive")
            self.iqr_ms += high - low
        self.median_ms += statistics.median(times_ms)

    def clear(self) -> None:
        self.iqr_ms = self.median_ms = 0.0

    def relative(self) -> float:
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0


class OpTimer:
    """Times one op's forward and backward on fresh copies of its inputs and measures its saved bytes."""

    def __init__(self, device: torch.device, *, warmup: int, repeats: int, skip_storages: frozenset[int]) -> None:
        self.device = device
        self.warmup = warmup
        self.repeats = repeats
        self.skip_storages = skip_storages
        self.spread = Spread()
        self.engine_overhead_ms = self._measure_engine_overhead()

    def measure(self, call: Callable[..., Any], make_inputs: Callable[[], Inputs],
                pick: Callable[[Any], Any] = lambda out: out) -> tuple[float, float, int]:
        """(forward ms, backward ms, saved activation bytes) of `call` on inputs from `make_inputs`.

        The backward starts from the outputs `pick(out)` selects (the ones the model uses), with
        the engine's fixed per-call overhead taken off.
        """
        with torch.enable_grad():
            for _ in range(self.warmup):
                self._run(call, make_inputs, pick)
            samples = [self._run(call, make_inputs, pick) for _ in range(self.repeats)]
            act_bytes = self._saved_bytes(call, make_inputs)
        self.spread.add([fwd + bwd for fwd, bwd in samples])
        return (statistics.median(fwd for fwd, _ in samples), statistics.median(bwd for _, bwd in samples),
                act_bytes)

    def _run(self, call: Callable[..., Any], make_inputs: Callable[..., Any],
             pick: Callable[[Any], Any]) -> tuple[float, float]:
        args, kwargs, leaves = make_inputs()
        out, fwd_ms = self._timed(lambda: call(*args, **kwargs))
        outs = [t for t in tensors_in(pick(out)) if t.requires_grad]
        if not outs or not leaves:
            return fwd_ms, 0.0
        return fwd_ms, max(self._grad_ms(outs, leaves) - self.engine_overhead_ms, 0.0)

    def _grad_ms(self, outs: list[torch.Tensor], leaves: list[torch.Tensor]) -> float:
        grads = [torch.ones_like(t) for t in outs]
        return self._timed(lambda: torch.autograd.grad(outs, leaves, grads, allow_unused=True))[1]

    def _timed(self, run: Callable[[], Any]) -> tuple[Any, float]:
        """`run()` and its milliseconds: on CUDA between two events on the device's stream (the kernels' time, not
        their launches' nor a synchronisation's), elsewhere the host's wall time."""
        if self.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record(stream)
            out = run()
            end.record(stream)
            end.synchronize()
            return out, float(start.elapsed_time(end))
        start_s = time.perf_counter()
        out = run()
        return out, (time.perf_counter() - start_s) * 1e3

    def whole_pass_ms(self, gm: torch.fx.GraphModule, inputs: tuple[Any, ...]) -> tuple[float, float] | None:
        """Median forward and backward ms of the whole traced model on `inputs` (the backward less the engine's
        fixed per-call overhead, as each op's is): what the ops' times are scaled to sum to. None when the
        whole pass does not fit in the device's memory (one op at a time did): the ops' own times stay."""
        weights: list[torch.Tensor] = [p for p in gm.parameters() if p.requires_grad]
        samples = []
        try:
            with torch.enable_grad():
                for _ in range(self.warmup + self.repeats):
                    out, fwd_ms = self._timed(lambda: gm(*inputs))
                    outs = [t for t in tensors_in(out) if t.requires_grad]
                    bwd_ms = self._grad_ms(outs, weights) - self.engine_overhead_ms if outs and weights else 0.0
                    samples.append((fwd_ms, max(bwd_ms, 0.0)))
                    del out, outs
        except (torch.cuda.OutOfMemoryError, MemoryError):
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None
        kept = samples[self.warmup:]
        return statistics.median(f for f, _ in kept), statistics.median(b for _, b in kept)

    def _measure_engine_overhead(self) -> float:
        """The fixed cost of one `autograd.grad` call, which a whole-model backward pays once, not per op."""
        leaf = torch.zeros(1, device=self.device, requires_grad=True)
        samples = [self._grad_ms([leaf.view_as(leaf)], [leaf]) for _ in range(self.warmup + 2 * self.repeats + 1)]
        return statistics.median(samples[self.warmup:])

    def _saved_bytes(self, call: Callable[..., Any], make_inputs: Callable[..., Any]) -> int:
        storages: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            ptr, num_bytes = _storage_of(tensor)
            if ptr not in self.skip_storages:
                storages[ptr] = num_bytes
            return tensor

        args, kwargs, _ = make_inputs()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = call(*args, **kwargs)
        del out
        return sum(storages.values())


class _OpProfiler(torch.fx.Interpreter):
    """Runs the traced model without gradients, timing each op on copies of its inputs when it is reached."""

    def __init__(self, gm: torch.fx.GraphModule, timer: OpTimer, bar: Any, batch_size: int) -> None:
        super().__init__(gm)
        self.batch_size = batch_size
        self.timer = timer
        self.bar = bar
        self.costs: dict[str, OpCost] = {}
        self.needs_grad: dict[str, bool] = {}

    def profile(self, inputs: tuple[Any, ...]) -> dict[str, OpCost]:
        self.run(*inputs)
        return self.costs

    def run_node(self, n: torch.fx.Node) -> Any:
        fwd_ms = bwd_ms = 0.0
        act_bytes = 0
        if n.op in TIMED_KINDS:
            try:
                fwd_ms, bwd_ms, act_bytes = self.timer.measure(self._callable(n), lambda: self._fresh_inputs(n),
                                                                _used_outputs(n))
            except Exception as err:
                raise CostError(f"profiling op {n.name!r} ({n.op} {n.target}) on a micro-batch of {self.batch_size} "
                                f"failed: {type(err).__name__}: {err}; leave out micro-batch sizes the model "
                                "cannot train on") from err
            self.bar.update(1)
        with torch.no_grad():
            value = super().run_node(n)
        self.needs_grad[n.name] = self._needs_grad(n, value)
        self.costs[n.name] = OpCost(fwd_ms=fwd_ms, bwd_ms=bwd_ms, act_bytes=act_bytes,
                                    output_bytes=sum(t.numel() * t.element_size() for t in tensors_in(value)),
                                    param_bytes=0)
        return value

    def _callable(self, n: torch.fx.Node) -> Callable[..., Any]:
        if n.op == "call_module":
            return self.module.get_submodule(str(n.target))
        if n.op == "call_method":
            method = str(n.target)
            return lambda obj, *args, **kwargs: getattr(obj, method)(*args, **kwargs)
        return n.target  # type: ignore[return-value]

    def _needs_grad(self, n: torch.fx.Node, value: Any) -> bool:
        """Whether the op's output needs a gradient in training: it depends on a trainable parameter."""
        if n.op == "get_attr":
            return isinstance(value, torch.Tensor) and value.requires_grad
        if any(self.needs_grad[src.name] for src in n.all_input_nodes):
            return True
        if n.op == "call_module":
            return any(p.requires_grad for p in self.module.get_submodule(str(n.target)).parameters())
        return False

    def _fresh_inputs(self, n: torch.fx.Node) -> Inputs:
        """Copies of the op's recorded inputs (so in-place ops cannot touch them) and the tensors to
        differentiate: inputs that need a gradient, trainable parameters read by the op."""
        leaves: list[torch.Tensor] = []
        copies: dict[str, Any] = {}

        def fresh(src: torch.fx.Node) -> Any:  # one copy per input op, so `x * x` still reads one tensor
            if src.name not in copies:
                copies[src.name] = _fresh_value(self.env[src], self.needs_grad[src.name], leaves)
            return copies[src.name]

        args = torch.fx.node.map_arg(n.args, fresh)
        kwargs = torch.fx.node.map_arg(n.kwargs, fresh)
        if n.op == "call_module":
            leaves.extend(p for p in self.module.get_submodule(str(n.target)).parameters() if p.requires_grad)
        return tuple(args), dict(kwargs), leaves


def _summing_to(costs: dict[str, OpCost], whole_ms: tuple[float, float]) -> dict[str, OpCost]:
    """`costs` with the forward and the backward times each scaled to sum to `whole_ms` (a pass whose ops took
    no time, or a whole pass not timed, is left as it is)."""
    fwd_sum, bwd_sum = sum(c.fwd_ms for c in costs.values()), sum(c.bwd_ms for c in costs.values())
    fwd_scale = whole_ms[0] / fwd_sum if fwd_sum > 0 and whole_ms[0] > 0 else 1.0
    bwd_scale = whole_ms[1] / bwd_sum if bwd_sum > 0 and whole_ms[1] > 0 else 1.0
    return {name: dataclasses.replace(cost, fwd_ms=cost.fwd_ms * fwd_scale, bwd_ms=cost.bwd_ms * bwd_scale)
            for name, cost in costs.items()}


def _used_outputs(n: torch.fx.Node) -> Callable[[Any], Any]:
    """Selects the parts of a tuple output that later ops read (all of it unless every user is `x[i]`)."""
    users = list(n.users)
    if not users or any(user.target is not operator.getitem or not isinstance(user.args[1], int) for user in users):
        return lambda out: out
    indices = sorted({idx for user in users if isinstance(idx := user.args[1], int)})
    return lambda out: [out[idx] for idx in indices] if isinstance(out, (tuple, list)) else out


def _fresh_value(value: Any, needs_grad: bool, leaves: list[torch.Tensor]) -> Any:
    if isinstance(value, nn.Parameter):
        if value.requires_grad:
            leaves.append(value)
        return value
    if isinstance(value, torch.Tensor):
        if needs_grad and (value.is_floating_point() or value.is_complex()):
            leaf = value.detach().requires_grad_()
            leaves.append(leaf)
            return leaf.clone()
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_fresh_value(item, needs_grad, leaves) for item in value)
    if isinstance(value, dict):
        return {key: _fresh_value(item, needs_grad, leaves) for key, item in value.items()}
    return value


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) tuple, list or dict value."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def inputs_like(graph: OpGraph, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Example inputs with the shapes and dtypes of the graph's placeholders: floats from a seeded
    normal distribution, integers (indices) zero."""
    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for name in graph.inputs:
        outputs = graph.op(name).outputs
        if len(outputs) != 1:
            raise CostError(f"model input {name!r} is not a single tensor; pass example_inputs to profile")
        meta = outputs[0]
        dtype = getattr(torch, meta.dtype)
        if dtype.is_floating_point:
            inputs.append(torch.randn(meta.shape, generator=generator, dtype=dtype))
        else:
            inputs.append(torch.zeros(meta.shape, dtype=dtype))
    return tuple(inputs)


def batch_of(example_inputs: tuple[Any, ...], size: int, device: torch.device) -> tuple[Any, ...]:
    """The example inputs cut (or repeated) to `size` rows along the batch dimension, on `device`."""
    batched = [x for x in example_inputs if isinstance(x, torch.Tensor) and x.dim() > 0]
    if not batched:
        raise CostError("example_inputs hold no tensor with a batch dimension; pass the example batch, batch first")
    example = int(batched[0].shape[0])

    def resize(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != example:
            return x.to(device) if isinstance(x, torch.Tensor) else x
        if size > example:
            x = x.repeat(-(-size // example), *([1] * (x.dim() - 1)))
        return x[:size].to(device)

    return tuple(resize(x) for x in example_inputs)


def _storage_of(tensor: torch.Tensor) -> tuple[int, int]:
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # tensors without a plain storage (sparse, wrappers)
        return id(tensor), tensor.numel() * tensor.element_size()


def _storage_ptrs(model: nn.Module) -> frozenset[int]:
    tensors = [*model.parameters(), *model.buffers()]
    return frozenset(_storage_of(t)[0] for t in tensors)


def _torch_device(device: str) -> torch.device:
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise CostError(f"device {device!r} requested but CUDA is not available here; profile with device='cpu'")
    if target.type not in ("cpu", "cuda"):
        raise CostError(f"cannot profile on device {device!r}; use 'cpu' or 'cuda'")
    return target


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _on_device(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` itself when its weights are already on `device`; else a copy moved there."""
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_meta for t in tensors):
        raise CostError("the model's weights are on the meta device, so it cannot run; build it on a real "
                        "device to profile, or use analytic_costs for a shape-only estimate")
    if all(_same_device(t.device, device) for t in tensors):
        return model
    return copy.deepcopy(model).to(device)


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def _traced_like(graph: OpGraph, model: nn.Module, example_inputs: Any,
                 leaf_modules: tuple[type | str, ...]) -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    """The model traced as the graph was captured, and the example as the values of its input ops."""
    from graphpipe.graph.capture import capture_module
    from graphpipe.graph.prune import prune_graph
    from graphpipe.graph.tracer import trace_module

    if example_inputs is None:
        if graph.capture == "export":
            raise CostError("the graph was captured with torch.export; pass example_inputs to profile it")
        return prune_graph(trace_module(model, leaf_modules)), inputs_like(graph)
    captured = capture_module(model, example_inputs, leaf_modules=leaf_modules, method=graph.capture,
                              with_graph=False)
    return captured.module, tuple(captured.bind(example_inputs).values())


def _check_same_ops(graph: OpGraph, gm: torch.fx.GraphModule) -> None:
    traced = {node.name for node in gm.graph.nodes}
    missing = [name for name in graph.names if name not in traced]
    if missing:
        raise CostError(f"{len(missing)} ops of graph {graph.name!r} are not in the traced model (e.g. "
                        f"{missing[:3]}); profile with the model and leaf_modules the graph was captured from")


def _with_params(cost: OpCost, param_bytes: int) -> OpCost:
    return OpCost(fwd_ms=cost.fwd_ms, bwd_ms=cost.bwd_ms, act_bytes=cost.act_bytes,
                  output_bytes=cost.output_bytes, param_bytes=param_bytes)


@contextlib.contextmanager
def _preserved(model: nn.Module, device: torch.device, num_threads: int | None) -> Iterator[None]:
    """Training mode and `num_threads` while profiling; mode, buffers, threads and RNG restored after."""
    was_training = model.training
    buffers = {name: buf.detach().clone() for name, buf in model.named_buffers()}
    old_threads = torch.get_num_threads()
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=rng_devices):
            if num_threads is not None:
                torch.set_num_threads(num_threads)
            model.train()
            yield
    finally:
        torch.set_num_threads(old_threads)
        model.train(was_training)
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name in buffers:
                    buf.copy_(buffers[name])


class _NoBar:
    """What the profiler calls on a progress bar, doing nothing: no progress shown, tqdm not needed."""

    def update(self, count: int = 1) -> None:
        del count


@contextlib.contextmanager
def _progress_bar(total: int, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield _NoBar()
        return
    from tqdm import tqdm

    with tqdm(total=total, desc="profiling ops", unit="op", leave=False) as bar:
        yield bar
