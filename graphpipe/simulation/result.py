"""What a simulation returns: a timeline of events and the numbers derived from it.

Times in the timeline are milliseconds from the start of the iteration; the summary
numbers use seconds (`iteration_time_s`) and bytes. Stage-keyed mappings round-trip
through JSON with string keys turned back into integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphpipe.serde import int_keys

__all__ = ["Event", "SimResult", "Timeline"]

EVENT_KINDS = ("forward", "backward", "send", "recv", "transfer", "all_reduce", "step", "core_wait")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One action of one stage (run by all of `ranks`), or one transfer on a link ("transfer")."""

    stage: int
    ranks: tuple[int, ...]
    action: str  # text form, e.g. "s2.F3"; a transfer names its send
    kind: str  # one of EVENT_KINDS
    start_ms: float
    end_ms: float
    micro_batch: int = -1

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "ranks": list(self.ranks), "action": self.action, "kind": self.kind,
                "start_ms": self.start_ms, "end_ms": self.end_ms, "micro_batch": self.micro_batch}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        return cls(stage=data["stage"], ranks=tuple(data["ranks"]), action=data["action"], kind=data["kind"],
                   start_ms=data["start_ms"], end_ms=data["end_ms"], micro_batch=data.get("micro_batch", -1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """All events of one simulated iteration, ordered by start time."""

    events: tuple[Event, ...]

    @property
    def end_ms(self) -> float:
        return max((e.end_ms for e in self.events), default=0.0)

    def of_stage(self, stage: int, *kinds: str) -> tuple[Event, ...]:
        return tuple(e for e in self.events if e.stage == stage and (not kinds or e.kind in kinds))

    def of_rank(self, rank: int, *kinds: str) -> tuple[Event, ...]:
        return tuple(e for e in self.events if rank in e.ranks and e.kind != "transfer"
                     and (not kinds or e.kind in kinds))

    def to_dict(self) -> dict[str, Any]:
        return {"events": [e.to_dict() for e in self.events]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timeline:
        return cls(events=tuple(Event.from_dict(e) for e in data["events"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Predicted iteration of a plan under a schedule."""

    iteration_time_s: float
    samples_per_s: float
    global_batch_size: int
    schedule: str
    bubble_fraction: Mapping[int, float]  # per stage: idle share of the iteration (compute F/B only is busy)
    peak_memory_bytes: tuple[int, ...]  # per device, indexed by rank
    static_memory_bytes: tuple[int, ...]  # per device: weights + gradients + optimizer state
    device_memory_bytes: int  # capacity of one device
    peak_in_flight_samples: Mapping[int, int]  # per stage, over all its ranks
    critical_path: tuple[str, ...]  # action texts, first to last
    timeline: Timeline = field(default_factory=lambda: Timeline(events=()))
    recompute_stages: tuple[int, ...] = ()  # stages whose backward runs their forward again (`Stage.recompute`)

    @property
    def max_bubble_fraction(self) -> float:
        return max(self.bubble_fraction.values(), default=0.0)

    @property
    def mean_bubble_fraction(self) -> float:
        values = list(self.bubble_fraction.values())
        return sum(values) / len(values) if values else 0.0

    @property
    def fits_in_memory(self) -> bool:
        return max(self.peak_memory_bytes, default=0) <= self.device_memory_bytes

    def summary(self) -> dict[str, Any]:
        """The numbers without the timeline (what `graphpipe simulate --json` prints)."""
        data = self.to_dict()
        data.pop("timeline")
        return data

    def to_dict(self) -> dict[str, Any]:
        return {"format": "graphpipe.simresult/1", "iteration_time_s": self.iteration_time_s,
                "samples_per_s": self.samples_per_s, "global_batch_size": self.global_batch_size,
                "schedule": self.schedule,
                "bubble_fraction": {str(k): v for k, v in sorted(self.bubble_fraction.items())},
                "peak_memory_bytes": list(self.peak_memory_bytes),
                "static_memory_bytes": list(self.static_memory_bytes),
                "device_memory_bytes": self.device_memory_bytes,
                "peak_in_flight_samples": {str(k): v for k, v in sorted(self.peak_in_flight_samples.items())},
                "critical_path": list(self.critical_path), "timeline": self.timeline.to_dict(),
                **({"recompute_stages": list(self.recompute_stages)} if self.recompute_stages else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SimResult:
        return cls(iteration_time_s=data["iteration_time_s"], samples_per_s=data["samples_per_s"],
                   global_batch_size=data["global_batch_size"], schedule=data["schedule"],
                   bubble_fraction=int_keys(dict(data["bubble_fraction"])),
                   peak_memory_bytes=tuple(data["peak_memory_bytes"]),
                   static_memory_bytes=tuple(data["static_memory_bytes"]),
                   device_memory_bytes=data["device_memory_bytes"],
                   peak_in_flight_samples=int_keys(dict(data["peak_in_flight_samples"])),
                   critical_path=tuple(data["critical_path"]),
                   timeline=Timeline.from_dict(data.get("timeline", {"events": []})),
                   recompute_stages=tuple(data.get("recompute_stages", ())))

    def __str__(self) -> str:
        return (f"SimResult({self.schedule}: {self.iteration_time_s * 1e3:.2f} ms/iteration, "
                f"{self.samples_per_s:.1f} samples/s, max bubble {self.max_bubble_fraction:.0%}, "
                f"peak memory {max(self.peak_memory_bytes, default=0) / 2**30:.2f} GiB)")
