"""A Chrome trace of the real execution on one rank, in the simulator's format.

Process = stage, thread = rank, one complete event ("X") per action with its name
without the stage prefix ("F3", "SF3>s4"), times in microseconds from the first step. On a GPU the
times are the device's (CUDA events around each action: when its kernels ran, not when the host launched
them; `graphpipe.runtime.action_clock`); `otherData.clock` says which.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from graphpipe.runtime.action_clock import HostClock
from graphpipe.runtime.executor import ActionEvent
from graphpipe.schedule.action import ActionKind
from graphpipe.serde import write_json_atomic


def _category(kind: ActionKind) -> str:
    """The trace category, read from the kind's properties so a new kind needs no entry here."""
    if kind.is_compute:
        return "compute"
    if kind.is_message:
        return "send" if kind.is_send else "recv"
    return "allreduce" if kind.is_collective else "step"


def rank_trace(rank: int, stage_idx: int, steps: Sequence[Sequence[ActionEvent]], origin_s: float,
               clock: str = HostClock.source) -> dict[str, Any]:
    """Events of every recorded step; `origin_s` is the monotonic time that becomes ts = 0; `clock` says how the
    times were taken."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": stage_idx, "tid": rank, "args": {"name": f"stage {stage_idx}"}},
        {"name": "process_sort_index", "ph": "M", "pid": stage_idx, "tid": rank, "args": {"sort_index": stage_idx}},
        {"name": "thread_name", "ph": "M", "pid": stage_idx, "tid": rank, "args": {"name": f"rank {rank}"}}]
    for step_idx, step in enumerate(steps):
        for event in step:
            action = event.action
            events.append({"name": str(action).split(".", 1)[1], "cat": _category(action.kind), "ph": "X",
                           "pid": stage_idx, "tid": rank, "ts": (event.start_s - origin_s) * 1e6,
                           "dur": max((event.end_s - event.start_s) * 1e6, 0.0),
                           "args": {"action": str(action), "micro_batch": action.micro_batch, "step": step_idx}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"rank": rank, "stage": stage_idx, "clock": clock}}


def write_rank_trace(directory: str | os.PathLike[str], rank: int, stage_idx: int,
                     steps: Sequence[Sequence[ActionEvent]], origin_s: float, clock: str = HostClock.source) -> str:
    path = os.path.join(directory, f"rank_{rank}.json")
    write_json_atomic(path, rank_trace(rank, stage_idx, steps, origin_s, clock))
    return path
