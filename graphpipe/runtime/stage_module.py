"""Split a traced model into one fx GraphModule per stage of a plan.

Values are named by the fx node that produces them (== the OpGraph op name). A stage
module takes its model inputs (placeholders it reads from the data) and the values it
receives from earlier stages, in that order, and returns a dict: every value a later
stage reads, plus, on the sink stage (the one owning the `output` op), the model output
under `MODEL_OUTPUT`.

Placeholders and `get_attr` nodes are free: they are copied into every stage that reads
them instead of being sent (every rank holds the data and the module tree).

Shared parameters: a parameter lives in exactly one stage. A parameter read by ops of two
stages (a module called twice, tied weights) is rejected when the stages are built, with
a message naming the parameter and the stages; put those ops in one stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from graphpipe.errors import TrainingError
from graphpipe.planner.stage_graph import Plan

MODEL_OUTPUT = "__model_output__"
_FREE_OPS = ("placeholder", "get_attr")


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


@dataclass(frozen=True, slots=True, kw_only=True)
class StageModule:
    """A stage's spec and the GraphModule that computes it (sharing the model's parameters)."""

    spec: StageSpec
    module: torch.fx.GraphModule

    def __call__(self, data: Mapping[str, Any], received: Mapping[str, Any]) -> dict[str, Any]:
        args = [data[name] for name in self.spec.data_inputs] + [received[name] for name in self.spec.inputs]
        result: dict[str, Any] = self.module(*args)
        return result

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        params = dict(self.module.named_parameters(remove_duplicate=False))
        return [(name, params[name]) for name in self.spec.param_names]

    def named_buffers(self) -> list[tuple[str, torch.Tensor]]:
        buffers = dict(self.module.named_buffers(remove_duplicate=False))
        return [(name, buffers[name]) for name in self.spec.buffer_names]


def split_stages(gm: torch.fx.GraphModule, plan: Plan) -> tuple[StageModule, ...]:
    """One StageModule per plan stage; raises TrainingError when the plan does not fit `gm`."""
    specs = stage_specs(gm, plan)
    return tuple(StageModule(spec=spec, module=_stage_graph_module(gm, spec)) for spec in specs)


def stage_specs(gm: torch.fx.GraphModule, plan: Plan) -> tuple[StageSpec, ...]:
    stage_of = _stage_of_nodes(gm, plan)
    nodes = list(gm.graph.nodes)
    num_stages = plan.num_stages
    computed: list[list[str]] = [[] for _ in range(num_stages)]
    data_inputs: list[dict[str, None]] = [{} for _ in range(num_stages)]
    crossing: dict[tuple[int, int], dict[str, None]] = {}
    for node in nodes:
        if node.op in _FREE_OPS:
            continue
        dst = stage_of[node.name]
        computed[dst].append(node.name)
        for src_node in node.all_input_nodes:
            if src_node.op == "placeholder":
                data_inputs[dst][src_node.name] = None
            elif src_node.op != "get_attr" and stage_of[src_node.name] != dst:
                _check_edge(plan, stage_of[src_node.name], dst, src_node.name, node.name)
                crossing.setdefault((stage_of[src_node.name], dst), {})[src_node.name] = None
    order = {node.name: idx for idx, node in enumerate(nodes)}
    params, buffers = _owned_tensors(gm, stage_of, num_stages)
    placeholders = [node.name for node in nodes if node.op == "placeholder"]
    sink = stage_of[next(node.name for node in nodes if node.op == "output")]
    specs = []
    for idx in range(num_stages):
        recvs = {src: tuple(vals) for (src, dst), vals in sorted(crossing.items()) if dst == idx}
        sends = {dst: tuple(vals) for (src, dst), vals in sorted(crossing.items()) if src == idx}
        specs.append(StageSpec(
            stage_idx=idx, nodes=tuple(computed[idx]),
            data_inputs=tuple(name for name in placeholders if name in data_inputs[idx]),
            inputs=_sorted_union(recvs.values(), order), outputs=_sorted_union(sends.values(), order),
            recvs=recvs, sends=sends, param_names=params[idx], buffer_names=buffers[idx], is_sink=idx == sink))
    return tuple(specs)


def _stage_of_nodes(gm: torch.fx.GraphModule, plan: Plan) -> dict[str, int]:
    stage_of = {op: stage.idx for stage in plan.stages for op in stage.ops}
    missing = [node.name for node in gm.graph.nodes if node.op not in _FREE_OPS and node.name not in stage_of]
    if missing:
        raise TrainingError(
            f"the plan for graph {plan.graph_name!r} puts {len(missing)} op(s) of the traced model in no stage "
            f"(first: {missing[:5]}); plan the same model, traced with the same leaf modules")
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
                   num_stages: int) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """Parameter and buffer names per stage; a parameter read by two stages is an error."""
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
    for name, readers in param_stages.items():
        if len(readers) > 1:
            where = ", ".join(f"stage {s} (op {op!r})" for s, op in sorted(readers.items()))
            raise TrainingError(f"parameter {name!r} is used by {where}; a parameter must live in exactly one "
                                "stage: plan those ops into one stage (graphpipe does not sync shared weights)")
    params: list[list[str]] = [[] for _ in range(num_stages)]
    for name, readers in param_stages.items():
        params[next(iter(readers))].append(name)
    buffers: list[list[str]] = [[] for _ in range(num_stages)]
    for name, stages in buffer_stages.items():
        buffers[min(stages)].append(name)
    return [tuple(p) for p in params], [tuple(b) for b in buffers]


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
    for name in spec.data_inputs + spec.inputs:
        env[name] = graph.placeholder(name)
    mine = set(spec.nodes)
    model_output: Any = None
    for node in gm.graph.nodes:
        if node.op == "get_attr" and any(user.name in mine for user in node.users):
            env[node.name] = graph.node_copy(node, lambda n: env[n.name])
        elif node.name in mine and node.op == "output":
            model_output = torch.fx.map_arg(node.args[0], lambda n: env[n.name])
        elif node.name in mine:
            env[node.name] = graph.node_copy(node, lambda n: env[n.name])
    result: dict[str, Any] = {name: env[name] for name in spec.outputs}
    if spec.is_sink:
        result[MODEL_OUTPUT] = model_output
    graph.output(result)
    return torch.fx.GraphModule(gm, graph, f"Stage{spec.stage_idx}")
