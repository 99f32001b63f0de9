"""Capture an nn.Module into an `OpGraph`, with torch.fx or torch.export, plus shape propagation.

`capture="fx"` traces symbolically (layers stay whole ops; `leaf_modules` keep more modules
whole); `capture="export"` uses `torch.export` (non-strict, dynamic batch dimension), which
follows what fx cannot (decorated forwards, output dataclasses: Hugging Face models);
`"auto"` tries fx and falls back to export (also where fx baked the example's batch size into
the graph). A model whose forward fixes the batch size is exported at one sample with static
shapes (`"export-static"`). Either way the result is a flat fx GraphModule (one placeholder per
input leaf) that the runtime splits into stages, and the `OpGraph` records every value's metas,
batch axis, whether it is a tensor, and which ops every stage recomputes
(`graphpipe.graph.replication`).

torch.export always runs as on the host (`graphpipe.graph.host_state`), whatever device the
model's tensors are on, so a model built without weights (`graphpipe.empty_weights`, or on
`meta`) and the same model with them give the same graph; shape propagation of a model without
weights runs on meta tensors, so models larger than this machine's memory are captured without
allocating their weights.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch import nn

from graphpipe.errors import GraphCaptureError
from graphpipe.graph.devices import place_graph_on, tensor_device
from graphpipe.graph.export_trace import BatchFixedError, export_module
from graphpipe.graph.host_state import all_on_host, host_value
from graphpipe.graph.meta_state import all_on_meta
from graphpipe.graph.op_attrs import call_attrs, module_attrs
from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef
from graphpipe.graph.param_owners import assign_params
from graphpipe.graph.prune import prune_graph
from graphpipe.graph.replication import mark_replicated
from graphpipe.graph.shape_record import NodeValues, record_values
from graphpipe.graph.tracer import DEFAULT_LEAF_TYPES, trace_module
from graphpipe.meta_weights import has_meta_tensors
from graphpipe.model_inputs import ModelInputs, as_model_inputs

__all__ = ["CAPTURE_METHODS", "DEFAULT_LEAF_TYPES", "CapturedModule", "capture", "capture_module", "trace_module"]

# "export-static": torch.export at one sample with every shape fixed, for models whose forward fixes the batch
# size; a graph records it as its method, and the runtime captures such a model so and runs it sample by sample.
CAPTURE_METHODS = ("auto", "fx", "export", "export-static")


@dataclass(frozen=True, eq=False)
class CapturedModule:
    """A model captured for splitting: the flat GraphModule, its `OpGraph`, and how to call it.

    `bind` turns the model's own call arguments into the placeholders' values; `model_output`
    rebuilds the model's output object from the graph's flat output (export flattens it).
    """

    module: torch.fx.GraphModule
    graph: OpGraph | None  # None when captured only to run (`with_graph=False`: no shape propagation)
    method: str  # "fx" or "export"
    input_names: tuple[str, ...]
    in_spec: pytree.TreeSpec | None = None  # export: the flattened (args, kwargs)
    out_spec: pytree.TreeSpec | None = None  # export: the output object
    signature: inspect.Signature | None = None  # fx: the model's forward

    def bind(self, inputs: Any) -> dict[str, Any]:
        """Placeholder name -> value for one call of the model with `inputs` (as `capture` takes them)."""
        given = as_model_inputs(inputs)
        if self.in_spec is not None:
            try:
                values = fx_pytree.tree_flatten_spec((tuple(given.args), dict(given.kwargs)), self.in_spec)
            except Exception as err:
                raise GraphCaptureError(f"the inputs do not have the structure the model was captured with: "
                                        f"{err}") from err
            return dict(zip(self.input_names, values))
        return _bind_fx(self.module, self.signature, given)

    def model_output(self, flat: Any) -> Any:
        """The output as the model returns it (a ModelOutput, a dict, ...), from the graph's output value."""
        if self.out_spec is None:
            return flat
        return pytree.tree_unflatten(list(flat), self.out_spec)


def capture(model: nn.Module, example_inputs: Any, *, leaf_modules: Iterable[type | str] = (),
            name: str | None = None, capture: str = "auto") -> OpGraph:
    """The `OpGraph` of `model` on `example_inputs` (a tensor, a tuple, a dict of keyword arguments or
    `ModelInputs`; batch first). Forward arguments the example leaves out stay at their defaults."""
    graph = capture_module(model, example_inputs, leaf_modules=leaf_modules, name=name, method=capture).graph
    assert graph is not None
    return graph


def capture_module(model: nn.Module, example_inputs: Any, *, leaf_modules: Iterable[type | str] = (),
                   name: str | None = None, method: str = "auto", with_graph: bool = True) -> CapturedModule:
    """Capture `model` with `method` ("auto": fx, then torch.export if fx fails). `with_graph=False`
    skips the `OpGraph` (two forward passes of shape propagation): what the runtime and the profiler
    need is the module and how to call it."""
    if method not in CAPTURE_METHODS:
        raise GraphCaptureError(f"unknown capture method {method!r}; use one of {', '.join(CAPTURE_METHODS)}")
    given = as_model_inputs(example_inputs)
    name = name or type(model).__name__
    leaf_modules = tuple(leaf_modules) if not isinstance(leaf_modules, (str, type)) else (leaf_modules,)
    if method in ("export", "export-static"):
        if leaf_modules:
            raise GraphCaptureError("leaf modules apply to fx capture only (torch.export keeps no module whole); "
                                    "drop --leaf-module or use --capture fx")
        return _captured_by_export(model, given, name, with_graph, static=method == "export-static")
    try:
        traced = _captured_by_fx(model, given, leaf_modules, name, with_graph)
    except GraphCaptureError as fx_error:
        if method == "fx" or leaf_modules:  # leaf modules are an fx notion: the user chose fx
            raise
        try:
            return _captured_by_export(model, given, name, with_graph)
        except GraphCaptureError as export_error:
            raise GraphCaptureError(f"neither torch.fx nor torch.export can capture {type(model).__name__}. "
                                    f"[fx] {fx_error} [export] {export_error}") from export_error
    if method == "auto" and not leaf_modules and traced.graph is not None and traced.graph.fixed_batch:
        # fx baked the example's batch into the graph (a size read as a Python int): export follows the batch
        try:
            return _captured_by_export(model, given, name, with_graph)
        except GraphCaptureError:
            pass
    return traced


def _captured_by_fx(model: nn.Module, given: ModelInputs, leaf_modules: tuple[Any, ...], name: str,
                    with_graph: bool) -> CapturedModule:
    gm = with_all_state(prune_graph(trace_module(model, leaf_modules, given=given)), model)
    signature = inspect.signature(type(model).forward)
    values = _bind_fx(gm, signature, given)
    graph = _op_graph(gm, model, given, list(values.values()), name=name, method="fx") if with_graph else None
    return CapturedModule(module=gm, graph=graph, method="fx", input_names=tuple(values), signature=signature)


def _captured_by_export(model: nn.Module, given: ModelInputs, name: str, with_graph: bool,
                        static: bool = False) -> CapturedModule:
    """Export with a dynamic batch; where the model fixes the batch size (its forward specialises it, or the
    graph export returns runs at the example's batch only: token counts baked into reshapes), export again
    with static shapes at one sample, as `export-static`: a static graph's ops can depend on its batch (one
    `getitem` per image), so the ranks run that one graph sample by sample (`graphpipe.runtime.per_sample`)."""
    if static:
        return _exported(model, given.with_batch_size(1), name, with_graph, static=True)
    try:
        captured = _exported(model, given, name, with_graph, static=False)
    except BatchFixedError:
        return _exported(model, given.with_batch_size(1), name, with_graph, static=True)
    if captured.graph is not None and captured.graph.fixed_batch:
        return _exported(model, given.with_batch_size(1), name, with_graph, static=True)
    return captured


def _exported(model: nn.Module, given: ModelInputs, name: str, with_graph: bool, static: bool) -> CapturedModule:
    # Always as on the host, whatever device the model's tensors are on (`host_state`): library code branches on
    # the device it sees, so a model planned without weights and the same model trained with them would give
    # different graphs otherwise.
    with all_on_host(model):
        gm, in_spec, out_spec = export_module(model, given.map_tensors(host_value), static=static)
    gm = with_all_state(prune_graph(adopt_model_tensors(gm, model)), model)
    place_graph_on(gm, tensor_device(model))
    input_names = tuple(node.name for node in gm.graph.nodes if node.op == "placeholder")
    flat = fx_pytree.tree_flatten_spec((tuple(given.args), dict(given.kwargs)), in_spec)
    if len(flat) != len(input_names):
        raise GraphCaptureError(f"torch.export gave {len(input_names)} inputs for {len(flat)} input leaves; "
                                "pass only tensors and constants as example inputs")
    method = "export-static" if static else "export"
    graph = _op_graph(gm, model, given, list(flat), name=name, method=method) if with_graph else None
    return CapturedModule(module=gm, graph=graph, method=method, input_names=input_names, in_spec=in_spec,
                          out_spec=out_spec)


def adopt_model_tensors(gm: torch.fx.GraphModule, model: nn.Module) -> torch.fx.GraphModule:
    """`gm` holding `model`'s own parameters and buffers where it holds copies of them under the same name
    (export on host placeholders leaves those behind): one tensor per name, so tied weights stay tied and a
    real model trains its own weights."""
    own = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    for table_name in ("_parameters", "_buffers"):
        for path, module in list(gm.named_modules(remove_duplicate=False)):
            table: dict[str, Any] = getattr(module, table_name)
            for key in list(table):
                full = f"{path}.{key}" if path else key
                if full in own and table[key] is not None:
                    table[key] = own[full]
    return gm


def with_all_state(gm: torch.fx.GraphModule, model: nn.Module) -> torch.fx.GraphModule:
    """`gm` holding every parameter and buffer of `model` under its own name, the unused ones too (a traced
    module keeps only what its graph reads), so that a stage's state and a checkpoint cover the whole model."""
    hold_tensors(gm, [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)])
    return gm


def hold_tensors(module: nn.Module, named: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Register each (name, tensor) on `module` under that dotted name, unless it is there already."""
    held = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    held |= {name for name, _ in module.named_buffers(remove_duplicate=False)}
    for name, tensor in named:
        if name in held:
            continue
        owner_path, _, leaf = name.rpartition(".")
        owner: nn.Module = module
        for part in owner_path.split(".") if owner_path else ():
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        if isinstance(tensor, nn.Parameter):
            owner.register_parameter(leaf, tensor)
        else:
            owner.register_buffer(leaf, tensor)


def _op_graph(gm: torch.fx.GraphModule, model: nn.Module, given: ModelInputs, flat_inputs: list[Any], *,
              name: str, method: str) -> OpGraph:
    batch_size = given.batch_size()
    if has_meta_tensors(gm):  # shapes only: meta inputs, and meta copies of any real buffers next to meta weights
        with all_on_meta(gm):
            values = record_values(gm, model, tuple(_to_meta(x) for x in flat_inputs), batch_size)
    else:
        values = record_values(gm, model, tuple(flat_inputs), batch_size)
    if method == "export-static":
        values = _per_sample(values)
    params = assign_params(gm, model)
    modules = {path for path, _ in model.named_modules(remove_duplicate=False) if path}
    ops = tuple(_op_node(node, gm, values, params.get(node.name, ()), module_stack(node, modules))
                for node in gm.graph.nodes)
    return OpGraph(name=name, ops=mark_replicated(ops), example_batch_size=batch_size, capture=method,
                   fixed_batch=values.fixed_batch)  # None after `_per_sample`: a one-sample graph runs at any


def _per_sample(values: NodeValues) -> NodeValues:
    """A graph captured at one sample runs sample by sample (`graphpipe.runtime.per_sample`): every value with a
    dimension is then per sample, its first dimension that sample's rows (16 image patches, say), and it can
    cross stages like a batch-first one."""
    metas = {name: tuple(replace(meta, batch_axis=0 if meta.shape else None) for meta in found)
             for name, found in values.metas.items()}
    return NodeValues(metas=metas, is_tensor=values.is_tensor)


def _bind_fx(gm: torch.fx.GraphModule, signature: inspect.Signature | None, given: ModelInputs) -> dict[str, Any]:
    """Values of the fx placeholders: arguments by name, `*args` in order, left-out ones at their defaults."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    params = list(signature.parameters.values())[1:] if signature is not None else []
    by_name: dict[str, Any] = dict(given.kwargs)
    extra: list[Any] = []
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for idx, value in enumerate(given.args):
        if idx < len(positional):
            by_name[positional[idx].name] = value
        else:
            extra.append(value)
    if not params:  # a bare GraphModule: placeholders in order
        extra = list(given.args)
    out: dict[str, Any] = {}
    for node in placeholders:
        target = str(node.target)
        if target in by_name:
            out[node.name] = by_name.pop(target)
        elif extra:
            out[node.name] = extra.pop(0)
        elif node.args:
            out[node.name] = node.args[0]
        else:
            wanted = ", ".join(str(n.target) for n in placeholders)
            raise GraphCaptureError(f"the inputs give no value for the model's input {target!r}; "
                                    f"pass {len(placeholders)} inputs ({wanted})")
    if extra or by_name:
        raise GraphCaptureError(f"the model takes {len(placeholders)} inputs "
                                f"({', '.join(str(n.target) for n in placeholders)}), got "
                                f"{len(placeholders) + len(extra) + len(by_name)}")
    return out


def module_stack(node: torch.fx.Node, modules: Collection[str]) -> tuple[tuple[str, str], ...]:
    """(qualified name, class) of the modules whose forward `node` ran in, outermost first, from the
    `nn_module_stack` that fx's tracer and torch.export both record. Entries that name no submodule of
    the model (export's root `''` and its placeholder entries for nodes it made itself) are left out, and a
    module called again (fx keys it `name@1`) appears once."""
    stack: list[tuple[str, str]] = []
    for value in (node.meta.get("nn_module_stack") or {}).values():
        path, cls = (value[0], value[1]) if isinstance(value, tuple) and len(value) >= 2 else ("", "")
        if not isinstance(path, str) or path not in modules or (stack and stack[-1][0] == path):
            continue
        name = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(cls)
        stack.append((path, name))
    return tuple(stack)


def _op_node(node: torch.fx.Node, gm: torch.fx.GraphModule, values: NodeValues, params: tuple[ParamRef, ...],
             stack: tuple[tuple[str, str], ...] = ()) -> OpNode:
    kind = str(node.op)
    module_path = str(node.target) if kind == "call_module" else None
    if module_path is not None:
        module = gm.get_submodule(module_path)
        module_type = type(module).__name__
        attrs = module_attrs(module)
    else:
        module_type = _callable_name(node)
        attrs = call_attrs(node) if kind in ("call_function", "call_method") else {}
    attrs["input_shapes"] = [list(meta.shape) for src in node.all_input_nodes
                             for meta in values.metas.get(src.name, ())]
    return OpNode(
        name=node.name, kind=kind, target=target_str(node), module_path=module_path, module_type=module_type,
        inputs=tuple(src.name for src in node.all_input_nodes), outputs=values.metas.get(node.name, ()),
        params=params, attrs=attrs, is_tensor=values.is_tensor.get(node.name, True), module_stack=stack)


def _callable_name(node: torch.fx.Node) -> str:
    if node.op in ("placeholder", "output", "get_attr"):
        return str(node.op)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):  # aten.linear.default -> "linear"
        return str(target.overloadpacket.__name__)
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def target_str(node: torch.fx.Node) -> str:
    """The op's target as the op graph names it: `aten.mul.Tensor`, `torch.add`, a module path."""
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__qualname__', getattr(target, '__name__', str(target)))}".lstrip(".")


def _to_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value
