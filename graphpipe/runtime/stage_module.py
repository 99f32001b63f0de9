"""Split a traced model into one fx GraphModule per stage of a plan.

Values are named by the fx node that produces them (== the OpGraph op name). A stage
module takes its model inputs (placeholders it reads from the data) and the values it
receives from earlier stages, in that order, and returns a dict: every value a later
stage reads, plus, on the sink stage (the one owning the `output` op), the model output
under `MODEL_OUTPUT`.

Placeholders, `get_attr` nodes and the plan's replicated ops (sizes, masks, position ids:
`graphpipe.graph.replication`) are free: every stage that reads them computes them itself
instead of receiving them (every rank holds the data and the module tree). Model inputs
without a batch axis are passed whole, the others cut by sample. A received value that the
stage changes in place (`nn.ReLU(inplace=True)` as its first op) is cloned first, so the
tensor autograd tracks for the sender is never overwritten.

Shared parameters: a parameter read by ops of several stages (tied embeddings, a module
called twice) is held by each of them (`StageSpec.shared_params`); the executor sums its
gradient over every rank of those stages before the optimizer step, so the copies stay equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from graphpipe.errors import TrainingError
from graphpipe.graph.capture import CapturedModule, hold_tensors
from graphpipe.graph.mutation import changes_of
from graphpipe.graph.replication import is_inplace_name
from graphpipe.runtime.per_sample import run_per_sample
from graphpipe.runtime.recompute import BufferGuard, run_recomputed
from graphpipe.stages.stage_graph import Plan

MODEL_OUTPUT = "__model_output__"
_FREE_OPS = ("placeholder", "get_attr")


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSpec:
    """The interface of one stage: what it reads, computes and sends, by value name."""

    stage_idx: int
    nodes: tuple[str, ...]  # fx nodes computed here (free nodes excluded)
    data_inputs: tuple[str, ...]  # model-input placeholders read from the data
    inputs: tuple[str, ...]  # values received from earlier stages, in topological order
    outputs: tuple[str, ...]  # values read by later stages, in topological order
    recvs: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # src stage -> values
    sends: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # dst stage -> values
    param_names: tuple[str, ...] = ()  # original model names
    buffer_names: tuple[str, ...] = ()
    is_sink: bool = False
    free_nodes: tuple[str, ...] = ()  # replicated nodes this stage computes for itself
    shared_params: tuple[str, ...] = ()  # of param_names, those other stages hold too
    data_batch_axes: Mapping[str, int | None] = field(default_factory=dict)  # data input -> axis cut by sample


@dataclass(frozen=True, slots=True, kw_only=True)
class StageModule:
    """A stage's spec and the GraphModule that computes it (sharing the model's parameters)."""

    spec: StageSpec
    module: torch.fx.GraphModule
    output_fn: Callable[[Any], Any] = _identity  # rebuilds the model's output object on the sink
    per_sample: bool = False  # a graph captured at one sample (`export-static`): run it sample by sample
    # the plan's `Stage.recompute`: keep only the inputs, run the forward again in the backward (`run_recomputed`)
    recompute: bool = False
    _buffers: BufferGuard | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.recompute:
            object.__setattr__(self, "_buffers", BufferGuard(self.module))

    def __call__(self, data: Mapping[str, Any], received: Mapping[str, Any], samples: int | None = None) -> dict[
            str, Any]:
        """The stage's values for one share of `samples` samples (needed by a stage captured at one sample).
        A recomputing stage under autograd keeps only `data` and `received` for its backward."""
        if self._buffers is not None and torch.is_grad_enabled():
            data_names, received_names = tuple(data), tuple(received)

            def compute(*values: Any) -> dict[str, Any]:
                return self._compute(dict(zip(data_names, values)),
                                     dict(zip(received_names, values[len(data_names):])), samples)

            result: dict[str, Any] = run_recomputed(compute, (*data.values(), *received.values()), self._buffers)
        else:
            result = self._compute(data, received, samples)
        if MODEL_OUTPUT in result:
            result[MODEL_OUTPUT] = self.output_fn(result[MODEL_OUTPUT])
        return result

    def _compute(self, data: Mapping[str, Any], received: Mapping[str, Any], samples: int | None) -> dict[str, Any]:
        if self.per_sample:
            if samples is None:
                raise TrainingError("a stage captured at one sample runs sample by sample: pass samples=")
            result: dict[str, Any] = run_per_sample(self._run, data, self.spec.data_batch_axes, received, samples)
            return result
        return self._run(data, received)

    def _run(self, data: Mapping[str, Any], received: Mapping[str, Any]) -> dict[str, Any]:
        args = [data[name] for name in self.spec.data_inputs] + [received[name] for name in self.spec.inputs]
        result: dict[str, Any] = self.module(*args)
        return result

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        params = dict(self.module.named_parameters(remove_duplicate=False))
        return [(name, params[name]) for name in self.spec.param_names]

    def named_buffers(self) -> list[tuple[str, torch.Tensor]]:
        buffers = dict(self.module.named_buffers(remove_duplicate=False))
        return [(name, buffers[name]) for name in self.spec.buffer_names]


def split_stages(source: CapturedModule | torch.fx.GraphModule, plan: Plan) -> tuple[StageModule, ...]:
    """One StageModule per plan stage; raises TrainingError when the plan does not fit the captured model."""
    gm = source.module if isinstance(source, CapturedModule) else source
    output_fn = source.model_output if isinstance(source, CapturedModule) else _identity
    specs = stage_specs(gm, plan)
    per_sample = plan.capture == "export-static"
    return tuple(StageModule(spec=spec, module=_stage_graph_module(gm, spec), output_fn=output_fn,
                             per_sample=per_sample, recompute=plan.stages[spec.stage_idx].recompute)
                 for spec in specs)


def stage_specs(gm: torch.fx.GraphModule, plan: Plan) -> tuple[StageSpec, ...]:
    stage_of = _stage_of_nodes(gm, plan)
    nodes = list(gm.graph.nodes)
    free = _free_nodes(gm, plan)
    writes = _free_writes(gm, free)
    by_name = {node.name: node for node in nodes}
    num_stages = plan.num_stages
    computed: list[list[str]] = [[] for _ in range(num_stages)]
    needs: list[dict[str, None]] = [{} for _ in range(num_stages)]  # free nodes each stage reads
    crossing: dict[tuple[int, int], dict[str, None]] = {}
    for node in nodes:
        if node.name in free:
            continue
        dst = stage_of[node.name]
        computed[dst].append(node.name)
        for src_node in node.all_input_nodes:
            if src_node.name in free:
                needs[dst][src_node.name] = None
            elif stage_of[src_node.name] != dst:
                _check_edge(plan, stage_of[src_node.name], dst, src_node.name, node.name)
                crossing.setdefault((stage_of[src_node.name], dst), {})[src_node.name] = None
    order = {node.name: idx for idx, node in enumerate(nodes)}
    params, buffers, shared = _owned_tensors(gm, stage_of, num_stages)
    sink = stage_of[next(node.name for node in nodes if node.op == "output")]
    axes = {node.name: plan.input_batch_axes.get(node.name, 0) for node in nodes if node.op == "placeholder"}
    specs = []
    for idx in range(num_stages):
        recvs = {src: tuple(vals) for (src, dst), vals in sorted(crossing.items()) if dst == idx}
        sends = {dst: tuple(vals) for (src, dst), vals in sorted(crossing.items()) if src == idx}
        closure = _free_closure(by_name, needs[idx], free, writes)
        data_inputs = tuple(name for name in axes if name in closure)
        specs.append(StageSpec(
            stage_idx=idx, nodes=tuple(computed[idx]), data_inputs=data_inputs,
            inputs=_sorted_union(recvs.values(), order), outputs=_sorted_union(sends.values(), order),
            recvs=recvs, sends=sends, param_names=params[idx], buffer_names=buffers[idx], is_sink=idx == sink,
            free_nodes=tuple(name for name in order if name in closure and name not in axes),
            shared_params=tuple(name for name in params[idx] if name in shared),
            data_batch_axes={name: axes[name] for name in data_inputs}))
    return tuple(specs)


def _free_nodes(gm: torch.fx.GraphModule, plan: Plan) -> frozenset[str]:
    """Nodes every reading stage computes itself: inputs, parameter reads and the plan's replicated ops."""
    replicated = set(plan.replicated)
    return frozenset(node.name for node in gm.graph.nodes if node.op in _FREE_OPS or node.name in replicated)


def _free_closure(by_name: Mapping[str, torch.fx.Node], wanted: Mapping[str, None], free: frozenset[str],
                  writes: Mapping[str, tuple[str, ...]]) -> set[str]:
    """The free nodes `wanted` and every free node they read, transitively, with the free in-place ops that
    write a tensor among them (`writes`: writer -> the nodes whose storage it writes, the root last), and what
    those read: a mask filled in place is filled in every stage that makes it."""
    closure: set[str] = set()
    stack = list(wanted)
    while stack:
        while stack:
            name = stack.pop()
            if name in closure:
                continue
            closure.add(name)
            stack.extend(src.name for src in by_name[name].all_input_nodes if src.name in free)
        stack = [writer for writer, chain in writes.items() if writer not in closure and chain[-1] in closure]
    return closure


def _free_writes(gm: torch.fx.GraphModule, free: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """The free in-place ops and the nodes whose storage each writes (`graphpipe.graph.mutation`)."""
    by_name = {node.name: node for node in gm.graph.nodes}

    def first_input(name: str) -> str | None:
        args = by_name[name].args
        return args[0].name if args and isinstance(args[0], torch.fx.Node) else None

    return changes_of((name for name in by_name if name in free), first_input,
                      lambda name: _target_name(by_name[name]), lambda name: _is_inplace(gm, by_name[name]))


def _stage_of_nodes(gm: torch.fx.GraphModule, plan: Plan) -> dict[str, int]:
    stage_of = {op: stage.idx for stage in plan.stages for op in stage.ops}
    missing = [node.name for node in gm.graph.nodes if node.op not in _FREE_OPS and node.name not in stage_of]
    if missing:
        raise TrainingError(
            f"the plan for graph {plan.graph_name!r} puts {len(missing)} op(s) of the traced model in no stage "
            f"(first: {missing[:5]}); plan the same model, traced with the same leaf modules, and pass the "
            "example inputs it was captured with (PipelineTrainer(..., example_inputs=...))")
    return stage_of


def _check_edge(plan: Plan, src: int, dst: int, value: str, reader: str) -> None:
    if src > dst:
        raise TrainingError(f"op {reader!r} in stage {dst} reads {value!r} from the later stage {src}; "
                            "stages must be numbered in topological order")
    if dst not in plan.successors[src]:
        raise TrainingError(f"op {reader!r} in stage {dst} reads {value!r} from stage {src}, but the plan has "
                            f"no stage edge s{src}->s{dst}; re-plan the model")


def _sorted_union(groups: Any, order: Mapping[str, int]) -> tuple[str, ...]:
    names = {name for group in groups for name in group}
    return tuple(sorted(names, key=order.__getitem__))


def _owned_tensors(gm: torch.fx.GraphModule, stage_of: Mapping[str, int],
                   num_stages: int) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]], set[str]]:
    """Parameter and buffer names per stage, and the parameters several stages hold (each holds a copy)."""
    param_names = {id(p): name for name, p in gm.named_parameters()}
    buffer_names = {id(b): name for name, b in gm.named_buffers()}
    param_stages: dict[str, dict[int, str]] = {}
    buffer_stages: dict[str, set[int]] = {}
    for node in gm.graph.nodes:
        for reader, tensor in _tensors_read(gm, node):
            stage = stage_of[reader]
            if id(tensor) in param_names:
                param_stages.setdefault(param_names[id(tensor)], {}).setdefault(stage, reader)
            elif id(tensor) in buffer_names:
                buffer_stages.setdefault(buffer_names[id(tensor)], set()).add(stage)
    shared = {name for name, readers in param_stages.items() if len(readers) > 1}
    sink = stage_of[next(node.name for node in gm.graph.nodes if node.op == "output")]
    params: list[list[str]] = [[] for _ in range(num_stages)]
    for name, readers in param_stages.items():
        for stage in sorted(readers):
            params[stage].append(name)
    params[sink] += [name for name in dict.fromkeys(param_names.values()) if name not in param_stages]  # unused
    buffers: list[list[str]] = [[] for _ in range(num_stages)]
    for name, stages in buffer_stages.items():
        buffers[min(stages)].append(name)
    buffers[sink] += [name for name in dict.fromkeys(buffer_names.values()) if name not in buffer_stages]
    return [tuple(p) for p in params], [tuple(b) for b in buffers], shared


def _tensors_read(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[tuple[str, torch.Tensor]]:
    """(computing op, tensor) for each parameter or buffer `node` reads; get_attr counts for its users."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        tensors: list[torch.Tensor] = [t for _, t in module.named_parameters(remove_duplicate=False)]
        tensors += [t for _, t in module.named_buffers(remove_duplicate=False)]
        return [(node.name, t) for t in tensors]
    if node.op == "get_attr":
        value = _get_attr(gm, str(node.target))
        tensors = [value] if isinstance(value, torch.Tensor) else []
        if isinstance(value, nn.Module):
            tensors = [*value.parameters(), *value.buffers()]
        return [(user.name, t) for user in node.users if user.op not in _FREE_OPS for t in tensors]
    return []


def _get_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _stage_graph_module(gm: torch.fx.GraphModule, spec: StageSpec) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    entries = spec.data_inputs + spec.inputs
    mine = set(spec.nodes)
    here = mine | set(spec.free_nodes)
    mutated = _mutated_entries(gm, set(entries), here)
    for name in entries:
        env[name] = graph.placeholder(name)
        if name in mutated:  # never overwrite a received tensor (a leaf of autograd) or the caller's data
            env[name] = graph.call_method("clone", (env[name],))
    model_output: Any = None
    for node in gm.graph.nodes:
        if node.op == "get_attr" and any(user.name in here for user in node.users):
            env[node.name] = graph.node_copy(node, lambda n: env[n.name])
        elif node.name in mine and node.op == "output":
            model_output = torch.fx.map_arg(node.args[0], lambda n: env[n.name])
        elif node.name in here and node.op != "placeholder":
            env[node.name] = graph.node_copy(node, lambda n: env[n.name])
    result: dict[str, Any] = {name: env[name] for name in spec.outputs}
    if spec.is_sink:
        result[MODEL_OUTPUT] = model_output
    graph.output(result)
    module = torch.fx.GraphModule(gm, graph, f"Stage{spec.stage_idx}")
    hold_tensors(module, [(name, gm.get_parameter(name)) for name in spec.param_names]
                 + [(name, gm.get_buffer(name)) for name in spec.buffer_names])  # unused ones too
    return module


def _mutated_entries(gm: torch.fx.GraphModule, entries: set[str], here: set[str]) -> set[str]:
    """Stage entries (received values, data) that an op of this stage changes in place."""
    found = set()
    for node in gm.graph.nodes:
        if node.name in here and node.args and isinstance(node.args[0], torch.fx.Node) \
                and node.args[0].name in entries and _is_inplace(gm, node):
            found.add(node.args[0].name)
    return found


def _is_inplace(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.kwargs.get("inplace") is True:
        return True
    if node.op == "call_module":
        return getattr(gm.get_submodule(str(node.target)), "inplace", False) is True
    return is_inplace_name(_target_name(node))


def _target_name(node: torch.fx.Node) -> str:
    """`fill_` for `aten.fill_.Scalar`, `view` for the method `view`."""
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]
