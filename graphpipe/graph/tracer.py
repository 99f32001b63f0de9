"""The one torch.fx tracer of graphpipe: which modules stay whole, and readable trace failures.

Capture, the profiler and the runtime all trace through `trace_module`, so the name of
an op in the `OpGraph` is the name of the fx node that the runtime later executes.
"""

from __future__ import annotations

import inspect
import linecache
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import torch
import torch.fx
from torch import nn
from torch.fx._symbolic_trace import PH

from graphpipe.errors import GraphCaptureError
from graphpipe.model_inputs import ModelInputs

DEFAULT_LEAF_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm,
    nn.Embedding, nn.EmbeddingBag, nn.MultiheadAttention,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh, nn.Sigmoid,
    nn.Softmax, nn.LogSoftmax, nn.Softplus, nn.Hardswish, nn.Hardsigmoid,
    nn.RNNBase,
)
_TORCH_DIR = str(Path(torch.__file__).parent)


class LeafTracer(torch.fx.Tracer):
    """An fx tracer whose leaf modules are the default layer types plus user-named types or modules.

    Strings name a module by its qualified name ("encoder.layers.3") or by its class name
    ("TransformerEncoderLayer"). The tracer remembers the module it was inside when tracing
    failed, so the error can name it.
    """

    def __init__(self, leaf_types: tuple[type[nn.Module], ...], leaf_names: frozenset[str]) -> None:
        super().__init__()
        self.leaf_types = leaf_types
        self.leaf_names = leaf_names
        self.path_stack: list[str] = []
        self.failed_in: tuple[str, str] | None = None  # (qualified name, class name)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (isinstance(m, self.leaf_types) or module_qualified_name in self.leaf_names
                or type(m).__name__ in self.leaf_names)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        path = self.path_of_module(m)
        self.path_stack.append(path)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = (path, type(m).__name__)
            raise
        finally:
            self.path_stack.pop()


def trace_module(model: nn.Module, leaf_modules: Iterable[type | str] = (), *,
                 num_inputs: int | None = None, given: ModelInputs | None = None) -> torch.fx.GraphModule:
    """Symbolically trace `model`; default layers plus `leaf_modules` (types or names) stay single ops.

    A `forward(self, *inputs)` is traced with `num_inputs` placeholders `input_0, input_1, ...`
    (default: the model's `num_inputs` attribute). With `given` example inputs, the forward
    arguments they leave out keep their defaults as constants (`forward(x, mask=None)` called
    with `x` alone traces one input). Raises GraphCaptureError naming the module and the source
    line fx could not trace.
    """
    leaf_types, leaf_names = _split_leaves(model, leaf_modules)
    tracer = LeafTracer(DEFAULT_LEAF_TYPES + leaf_types, leaf_names)
    if given is not None:
        num_inputs = len(given.args) if num_inputs is None else num_inputs
    concrete_args: Any = _varargs_placeholders(model, num_inputs)
    if concrete_args is None and given is not None:
        concrete_args = _defaults_of_missing(model, given) or None
    try:
        graph = tracer.trace(model, concrete_args=cast(Any, concrete_args))  # fx also takes a tuple
    except Exception as err:
        raise _capture_error(model, tracer, err) from err
    name = type(model).__name__
    return torch.fx.GraphModule(tracer.root, graph, name)


def _varargs_placeholders(model: nn.Module, num_inputs: int | None) -> tuple[Any, ...] | None:
    """fx gives a `forward(self, *inputs)` one placeholder per input only when told how many there are."""
    params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    if not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return None
    count = num_inputs if num_inputs is not None else getattr(model, "num_inputs", None)
    if len(params) != 1 or not isinstance(count, int) or count < 1:
        raise GraphCaptureError(
            f"{type(model).__name__}.forward takes *{params[-1].name if params else 'args'}; tracing needs "
            "forward(self, *inputs) alone plus the number of inputs: pass num_inputs= (capture passes "
            "len(example_inputs)) or set model.num_inputs, or give forward named arguments")
    return (PH,) * count


def _defaults_of_missing(model: nn.Module, given: ModelInputs) -> dict[str, Any]:
    """The forward arguments the example leaves out, at their defaults (fx traces them as constants)."""
    params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    named = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = set(given.kwargs) - {p.name for p in named}
    if unknown:
        raise GraphCaptureError(f"{type(model).__name__}.forward has no argument(s) {sorted(unknown)}; "
                                f"it takes {[p.name for p in named]}")
    missing: dict[str, Any] = {}
    for idx, param in enumerate(named):
        if idx < len(given.args) or param.name in given.kwargs:
            continue
        if param.default is inspect.Parameter.empty:
            raise GraphCaptureError(f"{type(model).__name__}.forward needs argument {param.name!r}, which the "
                                    "example inputs do not give; add it to the example inputs")
        missing[param.name] = param.default
    return missing


def _split_leaves(model: nn.Module, leaf_modules: Iterable[type | str]) -> tuple[tuple[type, ...], frozenset[str]]:
    if isinstance(leaf_modules, (str, type)):
        leaf_modules = (leaf_modules,)
    types: list[type] = []
    names: set[str] = set()
    known = {name for name, _ in model.named_modules()} | {type(mod).__name__ for mod in model.modules()}
    for leaf in leaf_modules:
        if isinstance(leaf, type):
            types.append(leaf)
        elif isinstance(leaf, str):
            if leaf not in known:
                raise GraphCaptureError(
                    f"leaf module {leaf!r} is neither a submodule name nor a module class in "
                    f"{type(model).__name__}; pass a qualified name as printed by model.named_modules() "
                    "or a class name")
            names.add(leaf)
        else:
            raise GraphCaptureError(f"leaf module {leaf!r} must be an nn.Module subclass or a string")
    return tuple(types), frozenset(names)


def _capture_error(model: nn.Module, tracer: LeafTracer, err: Exception) -> GraphCaptureError:
    path, cls = tracer.failed_in or ("", type(model).__name__)
    where = f"module {path!r} ({cls})" if path else f"the model's own forward ({cls})"
    at = _user_source_line(err)
    hint = (f"pass leaf_modules=[{path!r}] (CLI: --leaf-module {path}) to keep it as one op"
            if path else "move the data-dependent part into a submodule and mark that submodule as a leaf")
    return GraphCaptureError(
        f"torch.fx could not trace {where}{at}: {type(err).__name__}: {err}. "
        f"Tracing cannot follow data-dependent control flow; {hint}.")


def _user_source_line(err: BaseException) -> str:
    """The innermost traceback frame outside torch: the line that fx complained about."""
    frames = [frame for frame in traceback.extract_tb(err.__traceback__)
              if not frame.filename.startswith(_TORCH_DIR) and not frame.filename.endswith("graph/tracer.py")]
    if not frames:
        return ""
    frame = frames[-1]
    source = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
    return f" at {frame.filename}:{frame.lineno} (`{source}`)"
