"""A Chrome trace (JSON, opens in Perfetto or chrome://tracing) of a simulated iteration.

One process per stage, one thread per rank of it (compute, receive waits, all-reduce,
step), and one extra thread per stage for its outgoing transfers. Complete events ("X")
with times in microseconds.
"""

from __future__ import annotations

import os
from typing import Any

from graphpipe.serde import write_json_atomic
from graphpipe.simulation.result import SimResult

TRANSFER_TID_BASE = 1_000_000  # transfer threads sit after every rank's thread


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace as a dict (`write_chrome_trace` writes it)."""
    events: list[dict[str, Any]] = []
    named: set[tuple[int, int]] = set()
    for event in result.timeline.events:
        tids = [TRANSFER_TID_BASE + event.stage] if event.kind == "transfer" else list(event.ranks)
        for tid in tids:
            if (event.stage, tid) not in named:
                named.add((event.stage, tid))
                events += _names(event.stage, tid)
            events.append({"name": event.action.split(".", 1)[1], "cat": event.kind, "ph": "X",
                           "pid": event.stage, "tid": tid, "ts": event.start_ms * 1e3,
                           "dur": max(event.duration_ms * 1e3, 0.0),
                           "args": {"action": event.action, "micro_batch": event.micro_batch}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": result.schedule, "iteration_time_s": result.iteration_time_s,
                          "samples_per_s": result.samples_per_s}}


def _names(stage: int, tid: int) -> list[dict[str, Any]]:
    thread = f"s{stage} transfers" if tid >= TRANSFER_TID_BASE else f"rank {tid}"
    return [{"name": "process_name", "ph": "M", "pid": stage, "tid": tid, "args": {"name": f"stage {stage}"}},
            {"name": "process_sort_index", "ph": "M", "pid": stage, "tid": tid, "args": {"sort_index": stage}},
            {"name": "thread_name", "ph": "M", "pid": stage, "tid": tid, "args": {"name": thread}}]


def write_chrome_trace(result: SimResult, path: str | os.PathLike[str]) -> str:
    write_json_atomic(path, chrome_trace(result))
    return str(path)
