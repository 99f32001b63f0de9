"""What a plan was made on, op for op: the fingerprint that `train` checks its own capture against.

A plan is a partition of one graph's ops, so the ranks must split exactly that graph. The
fingerprint records, per op, its structure (name, kind, target, inputs, and the name, shape and
size of every parameter it owns) and its output shapes at the example batch, with the capture
method and the example batch. The structure can be computed from a captured `GraphModule` and
its model alone (`structure_of`, what every rank does, no forward pass); the shapes need the op
graph's shape propagation (what `graphpipe train` does once before any worker starts).
`difference` names the first op that differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx
from torch import nn

from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef

__all__ = ["GraphFingerprint", "difference", "fingerprint_of", "structure_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphFingerprint:
    """The graph a plan partitions: capture method, example batch, and one line of structure and one of
    output shapes per op, in graph order."""

    capture: str
    example_batch_size: int
    ops: tuple[str, ...]
    shapes: tuple[str, ...]

    @property
    def digest(self) -> str:
        """A short hash of everything above, to name a graph in messages and files."""
        text = "\n".join((self.capture, str(self.example_batch_size), *self.ops, *self.shapes))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"capture": self.capture, "example_batch_size": self.example_batch_size, "digest": self.digest,
                "ops": list(self.ops), "shapes": list(self.shapes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GraphFingerprint:
        return cls(capture=str(data["capture"]), example_batch_size=int(data["example_batch_size"]),
                   ops=tuple(data["ops"]), shapes=tuple(data["shapes"]))


def fingerprint_of(graph: OpGraph) -> GraphFingerprint:
    """The fingerprint of a captured op graph."""
    ops = tuple(_line(op.name, op.kind, op.target, op.inputs, op.params) for op in graph.ops)
    shapes = tuple(_shapes(op) for op in graph.ops)
    return GraphFingerprint(capture=graph.capture, example_batch_size=graph.example_batch_size, ops=ops,
                            shapes=shapes)


def structure_of(gm: torch.fx.GraphModule, model: nn.Module) -> tuple[str, ...]:
    """The per-op structure lines of `fingerprint_of`, from a captured module and its model (no shapes, no
    forward pass): what a rank compares with its plan."""
    from graphpipe.graph.capture import target_str
    from graphpipe.graph.param_owners import assign_params

    params = assign_params(gm, model)
    return tuple(_line(node.name, str(node.op), target_str(node), tuple(src.name for src in node.all_input_nodes),
                       params.get(node.name, ())) for node in gm.graph.nodes)


def difference(planned: GraphFingerprint, ops: Sequence[str], shapes: Sequence[str] | None = None) -> str | None:
    """Where a graph (its structure lines, and its shape lines if known) differs from the planned one, in
    words, or None when it is the same."""
    for idx, (want, got) in enumerate(zip(planned.ops, ops)):
        if want != got:
            return f"op {idx + 1} of {len(planned.ops)} differs: the plan has `{want}`, this model has `{got}`"
    if len(planned.ops) != len(ops):
        extra = ops[len(planned.ops):] or planned.ops[len(ops):]
        return (f"the plan's graph has {len(planned.ops)} ops, this model's {len(ops)} (first unmatched: "
                f"`{extra[0]}`)")
    for idx, (want, got) in enumerate(zip(planned.shapes, shapes or ())):
        if want != got:
            name = planned.ops[idx].split(" ", 1)[0]
            return (f"op {name!r} has outputs {got} here and {want} in the plan (at example batch "
                    f"{planned.example_batch_size})")
    return None


def _line(name: str, kind: str, target: str, inputs: Sequence[str], params: Sequence[ParamRef]) -> str:
    owned = "".join(f" [{p.name} {'x'.join(map(str, p.shape)) or 'scalar'} {p.num_bytes}B]" for p in params)
    return f"{name} = {kind} {target}({', '.join(inputs)}){owned}"


def _shapes(op: OpNode) -> str:
    return "; ".join(f"{meta.dtype}[{', '.join(map(str, meta.shape))}]" for meta in op.outputs)
