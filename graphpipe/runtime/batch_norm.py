"""Train-mode BatchNorm in a pipeline: per micro-batch share (torch's default), deferred, or synchronised.

A stage computes each micro-batch in data-parallel shares of b / d samples, so a plain
`nn.BatchNorm` normalises with the statistics of one share and moves its running statistics
once per share: M * d small updates per mini-batch instead of one, each from a noisier
estimate. That is what every pipeline system does, and it stays the default (`"micro"`).
Two modes get closer to single-device training on the whole mini-batch:

- `"deferred"` (torchgpipe's DeferredBatchNorm): a share is still normalised with its own
  statistics (the training numbers are those of `"micro"`), but the running statistics are
  not touched per share. Each BatchNorm adds its input's per-channel sum, sum of squares and
  count to float64 accumulators; at the optimizer step (`BatchNormRule.commit`) they are
  summed over the stage's data-parallel ranks and the running mean and unbiased variance move
  once, with the module's momentum: exactly what one `nn.BatchNorm` forward over the whole
  mini-batch on one device would leave. Costs one all-reduce per stage and step (2C + 1 numbers
  per module, all modules in one tensor).
- `"sync"`: a share is normalised with the statistics of its whole micro-batch, summed over
  the stage's data-parallel ranks (SyncBatchNorm over the stage's group), and the backward
  all-reduces the matching gradient terms, so the gradients are those of a single device that
  runs each micro-batch whole. Running statistics as in `"deferred"`. torch's
  `nn.SyncBatchNorm` runs only on CUDA; this one runs over the runtime's `Transport`, so gloo,
  CPU and the in-process thread hub work too. One all-reduce per forward and one per backward,
  per module and micro-batch: the ranks of a stage run the same action list, so every rank
  issues them in the same order.

A recomputing stage (`Stage.recompute`, `graphpipe.runtime.recompute`) runs its forward twice per micro-batch;
the second run adds nothing to the sums (`recomputing()`), and in the default mode the running statistics
nn.BatchNorm writes in the second run are put back, so every mode moves them exactly as without recomputation.
In "sync" the second run all-reduces the statistics again, on every rank of the stage alike.

The modules are swapped in the stage's GraphModule for a `PipelineBatchNorm` that holds the
*same* Parameter and buffer objects under the same names, so the optimizer, checkpoints and
`StageModule.named_parameters()/named_buffers()` are unchanged. A module called twice per
forward accumulates both calls into its one update. Batch norm computed as a function (what
torch.export capture leaves: `aten.batch_norm`) cannot be swapped; such stages are refused for
the two non-default modes, with the fix (capture with fx, so BatchNorm stays a module).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.fx
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from graphpipe.errors import TrainingError
from graphpipe.runtime.comm import Transport
from graphpipe.runtime.recompute import recomputing
from graphpipe.runtime.stage_module import StageModule

__all__ = ["BATCH_NORM_MODES", "BatchNormRule", "PipelineBatchNorm", "prepare_batch_norm"]

BATCH_NORM_MODES = ("micro", "deferred", "sync")
_ACCUMULATOR = torch.float64  # sums of squares over a whole mini-batch: float32 would lose the variance


class BatchNormRule:
    """What the trainer calls once per mini-batch, at the optimizer step."""

    def commit(self) -> None:
        """Nothing to do in the default mode."""


def prepare_batch_norm(stage: StageModule, mode: str, *, transport: Transport,
                       dp_ranks: Sequence[int]) -> BatchNormRule:
    """Swap the stage's BatchNorm modules for `mode`; the returned rule's `commit` runs at each STEP.
    The running statistics follow from the accumulated sums and counts, however many calls made them."""
    if mode not in BATCH_NORM_MODES:
        raise TrainingError(f"batch_norm must be one of {', '.join(BATCH_NORM_MODES)}, got {mode!r}")
    if mode == "micro":
        return BatchNormRule()
    _refuse_functional_batch_norm(stage, mode)
    ranks = tuple(dp_ranks)
    modules = [_swap(stage.module, target, mode, transport, ranks) for target in _batch_norm_targets(stage.module)]
    tracked = [module for module in modules if module.track_running_stats]
    if not tracked:
        return BatchNormRule()
    # sync: every rank already holds the whole micro-batches' sums, so there is nothing to add up
    return _RunningStatsRule(tracked, transport, ranks if mode == "deferred" else ())


# ---- the rule: running statistics once per mini-batch ------------------------------------------
class _RunningStatsRule(BatchNormRule):
    """Moves every swapped module's running statistics once, from the sums of the whole mini-batch."""

    def __init__(self, modules: Sequence[PipelineBatchNorm], transport: Transport, ranks: Sequence[int]) -> None:
        self.modules = tuple(modules)  # in graph order: the same on every rank, so is the all-reduce's layout
        self.transport = transport
        self.ranks = tuple(ranks)

    def commit(self) -> None:
        """One all-reduce of every module's [sum, sum of squares, count] (none for one rank), then the updates."""
        flat = torch.cat([module.take_moments() for module in self.modules])
        if len(self.ranks) > 1:
            self.transport.all_reduce_sum_(flat, self.ranks)
        for module, moments in zip(self.modules, torch.split(flat, [m.num_features * 2 + 1 for m in self.modules])):
            module.update_running_stats(moments)


# ---- the wrapper module ---------------------------------------------------------------------------
class PipelineBatchNorm(nn.Module):
    """A BatchNorm of a pipeline stage in mode "deferred" or "sync", sharing the original's tensors.

    `weight`, `bias`, `running_mean`, `running_var` and `num_batches_tracked` are the original
    module's own objects, so the names `<path>.weight` etc. and the optimizer's parameters stay
    valid. In eval mode it computes exactly what the original would.
    """

    _version = 2  # _BatchNorm's state-dict version: checkpoints of either load into the other
    weight: nn.Parameter | None
    bias: nn.Parameter | None
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor | None

    def __init__(self, original: _BatchNorm, mode: str, *, transport: Transport, ranks: Sequence[int]) -> None:
        super().__init__()
        self.num_features = original.num_features
        self.eps = original.eps
        self.momentum = original.momentum
        self.affine = original.affine
        self.track_running_stats = original.track_running_stats
        self.mode = mode
        self.training = original.training
        self.register_parameter("weight", original.weight)
        self.register_parameter("bias", original.bias)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(name, getattr(original, name, None))
        self._check_input_dim: Callable[[torch.Tensor], None] = original._check_input_dim
        self._transport = transport
        self._ranks = tuple(ranks)
        self._moments: torch.Tensor | None = None  # float64 [sum (C), sum of squares (C), count] since commit

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}, mode={self.mode!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training:
            return self._eval_forward(x)
        if self.mode == "sync":
            sync_batch_norm = cast(Callable[..., tuple[torch.Tensor, torch.Tensor]], _SyncBatchNormFn.apply)
            out, totals = sync_batch_norm(x, self.weight, self.bias, self.eps, self._transport, self._ranks)
            self._accumulate(totals)
            return out
        self._accumulate(_local_moments(x.detach()))
        return nn.functional.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    def _eval_forward(self, x: torch.Tensor) -> torch.Tensor:
        """As `_BatchNorm.forward` in eval mode: running statistics, or the batch's when there are none."""
        batch_stats = self.running_mean is None and self.running_var is None
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                        batch_stats, 0.0, self.eps)

    def _accumulate(self, moments: torch.Tensor) -> None:
        if not self.track_running_stats or recomputing():  # a recompute sees the same samples again
            return
        self._moments = moments if self._moments is None else self._moments + moments

    def take_moments(self) -> torch.Tensor:
        """The sums since the last commit (zeros when this step ran no train-mode forward), and reset them."""
        moments = self._moments
        self._moments = None
        if moments is None:
            assert self.running_mean is not None
            return torch.zeros(2 * self.num_features + 1, dtype=_ACCUMULATOR, device=self.running_mean.device)
        return moments

    @torch.no_grad()
    def update_running_stats(self, moments: torch.Tensor) -> None:
        """One running-statistics update from the whole mini-batch's sums, as one nn.BatchNorm call makes it."""
        running_mean, running_var, tracked = self.running_mean, self.running_var, self.num_batches_tracked
        assert running_mean is not None and running_var is not None and tracked is not None
        count = float(moments[-1])
        if count <= 0:  # no train-mode forward this step: torch would not have moved them either
            return
        mean, var = _mean_var(moments[:-1], count)
        unbiased = var * (count / max(count - 1.0, 1.0))
        tracked.add_(1)
        factor = 1.0 / float(tracked) if self.momentum is None else float(self.momentum)
        running_mean.mul_(1.0 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
        running_var.mul_(1.0 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)


# ---- synchronised batch norm over the Transport ---------------------------------------------------
class _SyncBatchNormFn(torch.autograd.Function):
    """Batch norm with statistics summed over `ranks`; its backward sums the matching gradient terms.

    The math of torch's SyncBatchNorm (torch/nn/modules/_functions.py), written with plain tensor
    ops (its `batch_norm_stats`/`batch_norm_elemt` kernels are CUDA-only) and the Transport's sum
    all-reduce. Statistics are reduced in float64. The weight and bias gradients stay local: the
    stage's data-parallel gradient all-reduce sums them like every other parameter's.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                transport: Transport, ranks: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        totals = _local_moments(x.detach())
        if len(ranks) > 1:
            transport.all_reduce_sum_(totals, ranks)
        count = float(totals[-1])
        mean, var = _mean_var(totals[:-1], count)
        invstd = torch.rsqrt(var + eps)
        out = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        if weight is not None:
            out = out * _per_channel(weight, x)
        if bias is not None:
            out = out + _per_channel(bias, x)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count = count
        ctx.bias_dtype = bias.dtype if bias is not None else x.dtype
        ctx.transport = transport
        ctx.ranks = ranks
        ctx.mark_non_differentiable(totals)
        return out.to(x.dtype), totals

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, _grad_totals: Any) -> tuple[Any, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        dims = _reduce_dims(x)
        xmu = x - _per_channel(mean, x)
        sum_dy = grad_out.sum(dims, dtype=_ACCUMULATOR)
        sum_dy_xmu = (grad_out * xmu).sum(dims, dtype=_ACCUMULATOR)
        grad_weight = grad_bias = grad_x = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        if ctx.needs_input_grad[0]:
            combined = torch.cat([sum_dy, sum_dy_xmu])
            if len(ctx.ranks) > 1:
                ctx.transport.all_reduce_sum_(combined, ctx.ranks)
            mean_dy, mean_dy_xmu = (combined / ctx.count).split(x.shape[1])
            scale = invstd if weight is None else invstd * weight.to(_ACCUMULATOR)
            grad_x = (grad_out - _per_channel(mean_dy, x) - xmu * _per_channel(invstd * invstd * mean_dy_xmu, x)) \
                * _per_channel(scale, x)
        return grad_x, grad_weight, grad_bias, None, None, None


# ---- helpers --------------------------------------------------------------------------------------
def _reduce_dims(x: torch.Tensor) -> list[int]:
    """Every dimension but the channels (dim 1): batch norm's statistics are per channel."""
    return [0, *range(2, x.dim())]


def _per_channel(values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over `x`, in `x`'s dtype."""
    return values.to(x.dtype).view(1, -1, *([1] * (x.dim() - 2)))


def _local_moments(x: torch.Tensor) -> torch.Tensor:
    """float64 [per-channel sum, per-channel sum of squares, number of values per channel] of `x`."""
    wide = x.to(_ACCUMULATOR)
    dims = _reduce_dims(x)
    count = torch.full((1,), x.numel() // max(x.shape[1], 1), dtype=_ACCUMULATOR, device=x.device)
    return torch.cat([wide.sum(dims), (wide * wide).sum(dims), count])


def _mean_var(sums: torch.Tensor, count: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and biased variance from [sum, sum of squares] over `count` values per channel."""
    total, squares = sums.chunk(2)
    mean = total / count
    return mean, (squares / count - mean * mean).clamp_min(0.0)


def _batch_norm_targets(gm: torch.fx.GraphModule) -> list[str]:
    """Targets of the stage's BatchNorm modules, in the order the graph first calls them (no repeats)."""
    targets = (str(node.target) for node in gm.graph.nodes if node.op == "call_module")
    return [target for target in dict.fromkeys(targets) if isinstance(gm.get_submodule(target), _BatchNorm)]


def _swap(gm: torch.fx.GraphModule, target: str, mode: str, transport: Transport,
          ranks: tuple[int, ...]) -> PipelineBatchNorm:
    """Put a PipelineBatchNorm at `target` of the stage module (the model's own module tree is untouched:
    the stage module's parents of its submodules are its own)."""
    original = gm.get_submodule(target)
    assert isinstance(original, _BatchNorm)
    wrapper = PipelineBatchNorm(original, mode, transport=transport, ranks=ranks)
    gm.set_submodule(target, wrapper)
    return wrapper


def _refuse_functional_batch_norm(stage: StageModule, mode: str) -> None:
    """Batch norm as a graph function (torch.export's aten ops, fx's F.batch_norm) has no module to swap."""
    for node in stage.module.graph.nodes:
        if node.op in ("call_function", "call_method") and "batch_norm" in _op_name(node.target):
            raise TrainingError(
                f"stage {stage.spec.stage_idx} computes batch norm as a function ({_op_name(node.target)}, op "
                f"{node.name!r}), which batch_norm={mode!r} cannot take over; capture the model with fx "
                "(capture='fx', --capture fx) so that BatchNorm stays a module, or use batch_norm='micro'")


def _op_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return str(getattr(target, "__name__", target))
