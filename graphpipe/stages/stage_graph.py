"""Stages, stage edges and plans: the planner's answer, immutable and JSON round-trippable.

A stage is a convex set of ops run data parallel on its ranks with one micro-batch size.
A stage edge carries the outputs of the ops named in `tensors` from `src` to `dst`.
Stage indices are in topological order of the stage graph (every edge goes from a lower
to a higher index), which is the order the runtime and the scheduler rely on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from graphpipe.cost.sources import CostSource
from graphpipe.errors import PlanValidationError
from graphpipe.graph.fingerprint import GraphFingerprint
from graphpipe.serde import JsonFile


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    idx: int
    ops: tuple[str, ...]  # in the op graph's topological order
    ranks: tuple[int, ...]  # data parallel over these ranks
    micro_batch_size: int  # samples per micro-batch, over all ranks of the stage
    in_flight_samples: int  # samples whose activations are alive at once (docs/method.md §3)
    fwd_ms: float = 0.0  # one micro-batch on one rank (micro_batch_size / len(ranks) samples)
    bwd_ms: float = 0.0
    memory_bytes: int = 0  # predicted peak per rank
    tps_ms: float = 0.0  # time per sample incl. communication share (the planner's objective)
    # Activation recomputation: keep only the stage's inputs per micro-batch in flight and run its forward
    # again in its backward (docs/method.md, "Activation recomputation"). Written to JSON only when true.
    recompute: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.recompute, bool):
            raise PlanValidationError(f"stage {self.idx}: recompute must be true or false, got {self.recompute!r}")
        if not self.ops:
            raise PlanValidationError(f"stage {self.idx} has no ops")
        if not self.ranks:
            raise PlanValidationError(f"stage {self.idx} has no ranks")
        if self.micro_batch_size < 1 or self.micro_batch_size % len(self.ranks):
            raise PlanValidationError(
                f"stage {self.idx}: micro-batch {self.micro_batch_size} does not split over "
                f"{len(self.ranks)} data-parallel ranks; use a multiple of {len(self.ranks)}")

    @property
    def data_parallel_degree(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {"idx": self.idx, "ops": list(self.ops), "ranks": list(self.ranks),
                "micro_batch_size": self.micro_batch_size, "in_flight_samples": self.in_flight_samples,
                "fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms, "memory_bytes": self.memory_bytes,
                "tps_ms": self.tps_ms, **({"recompute": True} if self.recompute else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stage:
        return cls(idx=data["idx"], ops=tuple(data["ops"]), ranks=tuple(data["ranks"]),
                   micro_batch_size=data["micro_batch_size"], in_flight_samples=data["in_flight_samples"],
                   fwd_ms=data.get("fwd_ms", 0.0), bwd_ms=data.get("bwd_ms", 0.0),
                   memory_bytes=data.get("memory_bytes", 0), tps_ms=data.get("tps_ms", 0.0),
                   recompute=data.get("recompute", False))

    def __str__(self) -> str:
        return (f"s{self.idx}[{len(self.ops)} ops, ranks {list(self.ranks)}, b={self.micro_batch_size}, "
                f"in-flight {self.in_flight_samples}{', recompute' if self.recompute else ''}]")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageEdge:
    src: int
    dst: int
    tensors: tuple[str, ...]  # op names in `src` whose outputs `dst` reads
    bytes_per_sample: float  # activation bytes per sample crossing the edge (the gradient is the same size)

    def __post_init__(self) -> None:
        if self.src >= self.dst:
            raise PlanValidationError(f"stage edge s{self.src}->s{self.dst} goes backwards; "
                                      "stages must be numbered in topological order")

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "tensors": list(self.tensors),
                "bytes_per_sample": self.bytes_per_sample}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageEdge:
        return cls(src=data["src"], dst=data["dst"], tensors=tuple(data["tensors"]),
                   bytes_per_sample=data["bytes_per_sample"])


@dataclass(frozen=True, kw_only=True)
class Plan(JsonFile):
    """A stage graph with its placement and the planner's predictions."""

    graph_name: str
    stages: tuple[Stage, ...]
    edges: tuple[StageEdge, ...]
    global_batch_size: int
    num_devices: int
    planner: str
    search_time_s: float = 0.0
    predicted_tps_ms: float = 0.0  # bottleneck stage's time per sample
    predicted_samples_per_s: float = 0.0
    predicted_iteration_s: float = 0.0
    lower_bound_samples_per_s: float = 0.0  # total compute / devices, no bubbles, no communication
    schedule: str = "1f1b"
    cluster: Mapping[str, Any] = field(default_factory=dict)  # Cluster.to_dict() it was planned for
    notes: tuple[str, ...] = ()
    # How to rebuild the model and its costs (so `graphpipe simulate plan.json` needs no costs file):
    # {"model": zoo name or file.py:factory, "preset", "batch", "options", "leaf_modules", "device"}.
    model_spec: Mapping[str, Any] = field(default_factory=dict)
    # The runtime's contract, from the op graph: how it was captured, which ops every reading stage
    # computes itself (never sent), and the batch axis of each model input (None: passed whole).
    capture: str = "fx"
    replicated: tuple[str, ...] = ()
    input_batch_axes: Mapping[str, int | None] = field(default_factory=dict)
    # Trainable parameters read by several stages (each holds a copy; one all-reduce over the plan's
    # ranks sums their gradients): name -> {"bytes", "owner" (the stage the costs count it in), "stages"}.
    shared_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    granularity: str = "op"  # what the planner cut between: "op", "layer" or "auto" (graphpipe.planner.granularity)
    # Where the costs the plan was searched with came from, so that the commands reading it cost it the
    # same way (graphpipe.cost.sources); None for plans that predate the record.
    cost_source: CostSource | None = None
    # The graph the stages partition, op for op (`graphpipe.graph.fingerprint`): what `train` checks the model
    # it splits against; None for plans made by hand or before the record.
    graph_fingerprint: GraphFingerprint | None = None

    def __post_init__(self) -> None:
        for pos, stage in enumerate(self.stages):
            if stage.idx != pos:
                raise PlanValidationError(f"stage at position {pos} has idx {stage.idx}; indices must be 0..n-1")
        ranks = [rank for stage in self.stages for rank in stage.ranks]
        if sorted(ranks) != list(range(len(ranks))):
            raise PlanValidationError(f"stage ranks {sorted(ranks)} do not partition 0..{len(ranks) - 1}")
        if len(ranks) > self.num_devices:
            raise PlanValidationError(f"plan uses {len(ranks)} ranks on {self.num_devices} devices")
        for edge in self.edges:
            if edge.dst >= len(self.stages):
                raise PlanValidationError(f"edge s{edge.src}->s{edge.dst} names a missing stage")
        for stage in self.stages:
            if self.global_batch_size % stage.micro_batch_size:
                raise PlanValidationError(
                    f"stage {stage.idx}: micro-batch {stage.micro_batch_size} does not divide the "
                    f"mini-batch {self.global_batch_size}")

    # ---- structure ----------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @cached_property
    def world_size(self) -> int:
        """Ranks in all (read per stage by every all-reduce time the simulator computes)."""
        return sum(len(stage.ranks) for stage in self.stages)

    @cached_property
    def predecessors(self) -> dict[int, tuple[int, ...]]:
        preds: dict[int, list[int]] = {stage.idx: [] for stage in self.stages}
        for edge in self.edges:
            preds[edge.dst].append(edge.src)
        return {idx: tuple(sorted(p)) for idx, p in preds.items()}

    @cached_property
    def successors(self) -> dict[int, tuple[int, ...]]:
        succ: dict[int, list[int]] = {stage.idx: [] for stage in self.stages}
        for edge in self.edges:
            succ[edge.src].append(edge.dst)
        return {idx: tuple(sorted(s)) for idx, s in succ.items()}

    @property
    def depth(self) -> int:
        """Number of stages on the longest path of the stage graph."""
        longest: dict[int, int] = {}
        for stage in self.stages:
            longest[stage.idx] = 1 + max((longest[p] for p in self.predecessors[stage.idx]), default=0)
        return max(longest.values(), default=0)

    @property
    def is_sequential(self) -> bool:
        """A chain of stages: every stage lies on the longest path (skip edges between them allowed)."""
        return self.depth == self.num_stages

    def stage_of_rank(self, rank: int) -> Stage:
        for stage in self.stages:
            if rank in stage.ranks:
                return stage
        raise PlanValidationError(f"rank {rank} is not in the plan (world size {self.world_size})")

    def stage_of_op(self, op: str) -> Stage:
        for stage in self.stages:
            if op in stage.ops:
                return stage
        raise PlanValidationError(f"op {op!r} is in no stage")

    def edge(self, src: int, dst: int) -> StageEdge:
        for edge in self.edges:
            if edge.src == src and edge.dst == dst:
                return edge
        raise PlanValidationError(f"no stage edge s{src}->s{dst}")

    def num_micro_batches(self, stage_idx: int) -> int:
        return self.global_batch_size // self.stages[stage_idx].micro_batch_size

    @property
    def peak_memory_bytes(self) -> int:
        return max((stage.memory_bytes for stage in self.stages), default=0)

    # ---- activation recomputation ---------------------------------------------------------
    @property
    def recompute_stages(self) -> tuple[int, ...]:
        """Indices of the stages that recompute their forward in their backward."""
        return tuple(stage.idx for stage in self.stages if stage.recompute)

    def with_recompute(self, stages: Iterable[int] | str) -> Plan:
        """This plan with exactly `stages` recomputing (indices, or the text `parse_recompute` reads: "all",
        "none", "s1,s3"); every other stage keeps its activations. The stages' predicted times and memory are
        left as they are: `graphpipe.simulation.reprice.recompute_plan` prices them again from costs."""
        chosen = parse_recompute(stages, self.num_stages) if isinstance(stages, str) else frozenset(stages)
        missing = sorted(idx for idx in chosen if not 0 <= idx < self.num_stages)
        if missing:
            raise PlanValidationError(f"recompute names stage(s) {missing}, but the plan has stages "
                                      f"s0..s{self.num_stages - 1}")
        return dataclasses.replace(self, stages=tuple(dataclasses.replace(stage, recompute=stage.idx in chosen)
                                                      for stage in self.stages))

    # ---- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "graphpipe.plan/1", "graph_name": self.graph_name,
            "stages": [stage.to_dict() for stage in self.stages], "edges": [edge.to_dict() for edge in self.edges],
            "global_batch_size": self.global_batch_size, "num_devices": self.num_devices, "planner": self.planner,
            "search_time_s": self.search_time_s, "predicted_tps_ms": self.predicted_tps_ms,
            "predicted_samples_per_s": self.predicted_samples_per_s,
            "predicted_iteration_s": self.predicted_iteration_s,
            "lower_bound_samples_per_s": self.lower_bound_samples_per_s, "schedule": self.schedule,
            "cluster": dict(self.cluster), "notes": list(self.notes), "model_spec": dict(self.model_spec),
            "capture": self.capture, "replicated": list(self.replicated),
            "input_batch_axes": dict(self.input_batch_axes), "shared_params": dict(self.shared_params),
            "granularity": self.granularity,
            "cost_source": self.cost_source.to_dict() if self.cost_source else None,
            "graph_fingerprint": self.graph_fingerprint.to_dict() if self.graph_fingerprint else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if data.get("format") != "graphpipe.plan/1":
            raise PlanValidationError(f"not a graphpipe plan (format {data.get('format')!r})")
        return cls(
            graph_name=data["graph_name"], stages=tuple(Stage.from_dict(s) for s in data["stages"]),
            edges=tuple(StageEdge.from_dict(e) for e in data["edges"]),
            global_batch_size=data["global_batch_size"], num_devices=data["num_devices"], planner=data["planner"],
            search_time_s=data.get("search_time_s", 0.0), predicted_tps_ms=data.get("predicted_tps_ms", 0.0),
            predicted_samples_per_s=data.get("predicted_samples_per_s", 0.0),
            predicted_iteration_s=data.get("predicted_iteration_s", 0.0),
            lower_bound_samples_per_s=data.get("lower_bound_samples_per_s", 0.0),
            schedule=data.get("schedule", "1f1b"), cluster=dict(data.get("cluster", {})),
            notes=tuple(data.get("notes", ())), model_spec=dict(data.get("model_spec", {})),
            capture=data.get("capture", "fx"), replicated=tuple(data.get("replicated", ())),
            input_batch_axes=dict(data.get("input_batch_axes", {})),
            shared_params=dict(data.get("shared_params", {})), granularity=data.get("granularity", "op"),
            cost_source=CostSource.from_dict(data["cost_source"]) if data.get("cost_source") else None,
            graph_fingerprint=(GraphFingerprint.from_dict(data["graph_fingerprint"])
                               if data.get("graph_fingerprint") else None),
        )

    def __str__(self) -> str:
        return (f"Plan({self.planner}, {self.num_stages} stages, depth {self.depth}, "
                f"{self.world_size} devices, batch {self.global_batch_size})")


def parse_recompute(text: str, num_stages: int) -> frozenset[int]:
    """The stages a `--recompute` value names: "all", "none", or stages separated by commas, each "s3" or "3"."""
    words = [word.strip().lower() for word in text.split(",") if word.strip()]
    if words == ["all"]:
        return frozenset(range(num_stages))
    if words in ([], ["none"]):
        return frozenset()
    chosen = set()
    for word in words:
        digits = word[1:] if word.startswith("s") else word
        if not digits.isdigit():
            raise PlanValidationError(f"recompute {text!r}: {word!r} is not a stage; write all, none, or stages "
                                      "such as s1,s3")
        idx = int(digits)
        if idx >= num_stages:
            raise PlanValidationError(f"recompute {text!r}: the plan has stages s0..s{num_stages - 1}, not s{idx}")
        chosen.add(idx)
    return frozenset(chosen)
