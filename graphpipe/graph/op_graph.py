"""The operator graph: an immutable, validated DAG of ops captured from an nn.Module.

Ops are stored in topological order. Placeholder ops are the model's inputs and the
single `output` op is its result; both are ops like any other so that a partition of
the op graph is a partition of the whole model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from graphpipe.errors import GraphValidationError
from graphpipe.graph.tensor_meta import TensorMeta
from graphpipe.serde import JsonFile

__all__ = ["OpGraph", "OpNode", "ParamRef"]

OP_KINDS = ("placeholder", "call_module", "call_function", "call_method", "get_attr", "output")
FREE_KINDS = ("placeholder", "get_attr")  # model inputs and parameter reads: on every rank already


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamRef:
    """A parameter (or buffer) an op owns, by its name in the original model."""

    name: str
    num_bytes: int
    shape: tuple[int, ...] = ()
    shared_with: tuple[str, ...] = ()  # other ops that use this parameter too
    is_buffer: bool = False  # a buffer (e.g. BatchNorm statistics): no gradient, no optimizer state

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "num_bytes": self.num_bytes, "shape": list(self.shape),
                "shared_with": list(self.shared_with), "is_buffer": self.is_buffer}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParamRef:
        return cls(name=data["name"], num_bytes=data["num_bytes"], shape=tuple(data.get("shape", ())),
                   shared_with=tuple(data.get("shared_with", ())), is_buffer=bool(data.get("is_buffer", False)))


@dataclass(frozen=True, slots=True, kw_only=True)
class OpNode:
    """One node of the op graph.

    `module_type` is the class name of a call_module target (e.g. "Linear") or the function
    or method name otherwise; `attrs` holds what the analytic cost model needs
    (e.g. {"in_features": 64}), JSON-serialisable values only. `is_tensor` says the value is
    one tensor (not a tuple, a size or a Python number); a `replicated` op is computed by every
    stage that reads it and never sent (model inputs, parameter reads, shape arithmetic, masks
    and position ids: see `graphpipe.graph.replication`). `module_stack` names the modules whose
    forward the op ran in, outermost first, each as (qualified name, class as "module.QualName"),
    the root model left out; empty for model inputs, parameter reads, ops of the root's own forward
    and graphs saved before the field existed. It is what layer granularity groups ops by
    (`graphpipe.graph.layers`).
    """

    name: str
    kind: str
    target: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    params: tuple[ParamRef, ...] = ()
    module_path: str | None = None
    module_type: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    is_tensor: bool = True
    replicated: bool = False
    module_stack: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise GraphValidationError(f"op {self.name!r}: unknown kind {self.kind!r}; expected one of {OP_KINDS}")
        if self.kind in FREE_KINDS and not self.replicated:
            object.__setattr__(self, "replicated", True)  # every rank holds the data and the parameters

    @property
    def can_cross(self) -> bool:
        """Whether the value can be sent between stages: one tensor with the batch as its first dimension."""
        return self.is_tensor and len(self.outputs) == 1 and self.outputs[0].batch_axis == 0

    @property
    def output_bytes(self) -> int:
        return sum(meta.num_bytes for meta in self.outputs)

    @property
    def param_bytes(self) -> int:
        return sum(param.num_bytes for param in self.params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "target": self.target, "inputs": list(self.inputs),
            "outputs": [meta.to_dict() for meta in self.outputs],
            "params": [param.to_dict() for param in self.params],
            "module_path": self.module_path, "module_type": self.module_type, "attrs": dict(self.attrs),
            "is_tensor": self.is_tensor, "replicated": self.replicated,
            "module_stack": [list(scope) for scope in self.module_stack],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpNode:
        return cls(
            name=data["name"], kind=data["kind"], target=data["target"], inputs=tuple(data["inputs"]),
            outputs=tuple(TensorMeta.from_dict(meta) for meta in data["outputs"]),
            params=tuple(ParamRef.from_dict(param) for param in data["params"]),
            module_path=data.get("module_path"), module_type=data.get("module_type", ""),
            attrs=dict(data.get("attrs", {})), is_tensor=data.get("is_tensor", len(data["outputs"]) == 1),
            replicated=data.get("replicated", False),
            module_stack=tuple((str(path), str(cls)) for path, cls in data.get("module_stack", ())),
        )

    def __str__(self) -> str:
        outs = ", ".join(map(str, self.outputs))
        return f"{self.name} = {self.module_type or self.target}({', '.join(self.inputs)}) -> {outs}"


@dataclass(frozen=True, kw_only=True)
class OpGraph(JsonFile):
    """A validated DAG of ops in topological order, captured with `example_batch_size` samples.

    `capture` names the method that made it ("fx", "export", or "export-static" for a model whose
    forward fixes the batch size): the runtime captures the model the same way, so that op names match.
    `fixed_batch` says why the graph runs at its example's batch size only (None: it runs at any).
    """

    name: str
    ops: tuple[OpNode, ...]
    example_batch_size: int
    capture: str = "fx"
    fixed_batch: str | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        seen: set[str] = set()
        for op in self.ops:
            if op.name in seen:
                raise GraphValidationError(f"duplicate op name {op.name!r} in graph {self.name!r}")
            for src in op.inputs:
                if src not in seen:
                    raise GraphValidationError(
                        f"op {op.name!r} reads {src!r}, which is not an earlier op: the graph has a cycle "
                        "or is not in topological order")
            seen.add(op.name)
        owners: dict[str, str] = {}
        for op in self.ops:
            for param in op.params:
                if param.name in owners:
                    raise GraphValidationError(
                        f"parameter {param.name!r} is owned by both {owners[param.name]!r} and {op.name!r}; "
                        "a parameter has exactly one owner (list the others in shared_with)")
                owners[param.name] = op.name
        if self.example_batch_size < 1:
            raise GraphValidationError(f"example_batch_size must be >= 1, got {self.example_batch_size}")

    # ---- lookups -------------------------------------------------------------------------
    @cached_property
    def _by_name(self) -> dict[str, OpNode]:
        return {op.name: op for op in self.ops}

    @cached_property
    def _index(self) -> dict[str, int]:
        return {op.name: idx for idx, op in enumerate(self.ops)}

    @cached_property
    def _successors(self) -> dict[str, tuple[str, ...]]:
        succ: dict[str, list[str]] = {op.name: [] for op in self.ops}
        for op in self.ops:
            for src in dict.fromkeys(op.inputs):
                succ[src].append(op.name)
        return {name: tuple(names) for name, names in succ.items()}

    def op(self, name: str) -> OpNode:
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphValidationError(f"no op named {name!r} in graph {self.name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def index(self, name: str) -> int:
        """Position of the op in topological order."""
        return self._index[name]

    def predecessors(self, name: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.op(name).inputs))

    def successors(self, name: str) -> tuple[str, ...]:
        return self._successors[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Placeholder ops: the model's inputs, in signature order."""
        return tuple(op.name for op in self.ops if op.kind == "placeholder")

    @property
    def output(self) -> str:
        return next(op.name for op in self.ops if op.kind == "output")

    @property
    def param_bytes(self) -> int:
        return sum(op.param_bytes for op in self.ops)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(param.name for op in self.ops for param in op.params)

    def edges(self) -> Iterator[tuple[str, str]]:
        for op in self.ops:
            for src in dict.fromkeys(op.inputs):
                yield src, op.name

    # ---- data edges: what stages send each other ---------------------------------------------
    @cached_property
    def replicated(self) -> frozenset[str]:
        """Ops every reading stage computes itself; their edges carry no message and order no stages."""
        return frozenset(op.name for op in self.ops if op.replicated)

    @cached_property
    def _data_preds(self) -> dict[str, tuple[str, ...]]:
        free = self.replicated
        return {op.name: tuple(src for src in dict.fromkeys(op.inputs) if src not in free) for op in self.ops}

    @cached_property
    def _data_succs(self) -> dict[str, tuple[str, ...]]:
        free = self.replicated
        return {name: () if name in free else succs for name, succs in self._successors.items()}

    def data_predecessors(self, name: str) -> tuple[str, ...]:
        """Producers whose values `name` receives when they run in another stage (replicated ones excluded)."""
        return self._data_preds[name]

    def data_successors(self, name: str) -> tuple[str, ...]:
        """Readers of `name`'s value across stages; none for a replicated op."""
        return self._data_succs[name]

    def data_edges(self) -> Iterator[tuple[str, str]]:
        """Edges that carry a message when their ends are in different stages."""
        for op in self.ops:
            for src in self._data_preds[op.name]:
                yield src, op.name

    # ---- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": "graphpipe.opgraph/1", "name": self.name, "example_batch_size": self.example_batch_size,
                "capture": self.capture, "fixed_batch": self.fixed_batch, "ops": [op.to_dict() for op in self.ops]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpGraph:
        return cls(name=data["name"], example_batch_size=data["example_batch_size"],
                   capture=data.get("capture", "fx"), fixed_batch=data.get("fixed_batch"),
                   ops=tuple(OpNode.from_dict(op) for op in data["ops"]))

    def __str__(self) -> str:
        return f"OpGraph({self.name!r}, {len(self.ops)} ops, {self.param_bytes / 2**20:.1f} MiB of parameters)"
