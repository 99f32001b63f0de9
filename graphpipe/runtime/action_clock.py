"""When each action ran: the host's clock on the CPU, CUDA events on a GPU.

On a GPU the host only launches kernels: timing an action on the host measures its launches, and the
kernels run later, while the host is already launching the next action. A `CudaClock` records a
`torch.cuda.Event(enable_timing=True)` on the device's current stream at each mark instead, and resolves
the marks only when asked (after the events completed), so a step pays no synchronisation for them.
Resolved marks are seconds on the host's monotonic clock, like `HostClock`'s: the clock's origin event
is recorded on an idle device (after one synchronisation, at construction) at a known host time, and every
mark is placed `elapsed_time` after it. Traces of ranks on one machine therefore share one time axis.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch


class ActionClock(Protocol):
    source: str  # how the marks are taken, for the trace's metadata

    def mark(self) -> Any: ...

    def seconds(self, mark: Any) -> float: ...


class HostClock:
    """Marks are `time.monotonic()` readings."""

    source = "host monotonic clock"

    def mark(self) -> float:
        return time.monotonic()

    def seconds(self, mark: Any) -> float:
        return float(mark)


class CudaClock:
    """Marks are CUDA events on `device`'s current stream; `seconds` waits for the event it resolves."""

    source = "CUDA events"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        torch.cuda.synchronize(device)  # the origin event runs at once: its host time is the recorded one
        self.origin = self.mark()
        self.origin.synchronize()
        self.origin_s = time.monotonic()

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, mark: Any) -> float:
        mark.synchronize()
        return self.origin_s + float(self.origin.elapsed_time(mark)) / 1e3


def clock_for(device: torch.device) -> ActionClock:
    """CUDA events on a CUDA device, the host's clock elsewhere."""
    if device.type == "cuda" and torch.cuda.is_available():
        return CudaClock(device)
    return HostClock()
