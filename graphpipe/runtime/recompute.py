"""Activation recomputation of a stage (`Stage.recompute`): keep only its inputs, run its forward again in its
backward.

`run_recomputed(fn, args, module)` calls `fn(*args)` under `torch.utils.checkpoint.checkpoint` (non-reentrant):
autograd keeps `args` (the stage's data and received values) and no activation of the stage; its backward
calls `fn` again to remake them. What that must not change:

- the random numbers: checkpoint's `preserve_rng_state` puts back, for the recompute, the CPU RNG state (and
  that of the device of the tensor arguments) the forward started from, so dropout draws the same mask. (Ranks
  run as threads of one process share one CPU generator: there a forward's draws already depend on the
  threads' interleaving, recomputed or not. One process per rank, as `graphpipe train` runs, is exact.)
- the module's state: a forward that writes its buffers (nn.BatchNorm's running statistics in the default
  batch-norm mode, `aten.batch_norm` in a torch.export graph) would write them twice. Buffers the recompute
  writes are put back to their values before it (`BufferGuard`: batch norms' by structure, others found by
  comparison the first time; then only those are copied); and `recomputing()` is true meanwhile, so
  `PipelineBatchNorm` (the "deferred" and "sync" modes) does not add the micro-batch's statistics twice.

No recompute without gradients (evaluation under `torch.no_grad()`): `fn` then runs once, as without it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

__all__ = ["recomputing", "run_recomputed"]

_local = threading.local()  # per thread: the in-process runtime runs one rank per thread


def recomputing() -> bool:
    """True while a recomputing stage runs its forward again inside its backward (on this thread)."""
    return bool(getattr(_local, "depth", 0))


@contextlib.contextmanager
def _recompute_phase() -> Iterator[None]:
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


class BufferGuard:
    """Puts back the buffers of `module` that a recompute writes: the running statistics of its batch norms
    (modules and, in a torch.export graph, `aten.batch_norm` calls), and any other buffer the first recompute
    changes (by version counter or by value; a kernel such as batch norm's writes its statistics without moving
    the counter, and a recompute can leave them at the same value by chance: momentum None on the first batch).
    The first recompute copies every buffer; later ones copy and put back only those."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.always = _batch_norm_buffers(module)
        self.written: tuple[str, ...] | None = None  # None: not known yet

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        buffers = dict(self.module.named_buffers(remove_duplicate=True))
        names = tuple(buffers) if self.written is None else self.written
        saved = {name: (buffers[name]._version, buffers[name].detach().clone()) for name in names}
        try:
            yield
        finally:
            written = []
            with torch.no_grad():
                for name, (version, value) in saved.items():
                    buffer = buffers[name]
                    if self.written is not None or name in self.always or buffer._version != version \
                            or not torch.equal(buffer, value):
                        buffer.copy_(value)
                        written.append(name)
            if self.written is None:
                self.written = tuple(written)


def _batch_norm_buffers(module: torch.nn.Module) -> frozenset[str]:
    """Names of the buffers batch norm writes in a train-mode forward: those of `_BatchNorm` modules, and the
    buffers a graph passes to a batch-norm function."""
    found = {f"{path}.{name}" if path else name for path, sub in module.named_modules()
             if isinstance(sub, _BatchNorm) for name, _ in sub.named_buffers(recurse=False)}
    graph = getattr(module, "graph", None)
    if isinstance(graph, torch.fx.Graph):
        for node in graph.nodes:
            if node.op in ("call_function", "call_method") and "batch_norm" in str(getattr(node.target, "__name__",
                                                                                           node.target)):
                found.update(str(arg.target) for arg in (*node.args, *node.kwargs.values())
                             if isinstance(arg, torch.fx.Node) and arg.op == "get_attr")
    return frozenset(found) & {name for name, _ in module.named_buffers(remove_duplicate=False)}


def run_recomputed(fn: Callable[..., Any], args: Sequence[Any], guard: BufferGuard) -> Any:
    """`fn(*args)` keeping only `args` for the backward, which runs `fn` again (see the module docstring).
    Without gradients enabled, just `fn(*args)`."""
    if not torch.is_grad_enabled():
        return fn(*args)
    calls = 0

    def once_or_again(*values: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return fn(*values)
        with _recompute_phase(), guard.kept():
            return fn(*values)

    return checkpoint(once_or_again, *args, use_reentrant=False, preserve_rng_state=True)
