"""How far a plan has got, for a caller that shows it (`PlanOptions.progress`).

A plan can take a while: op level on thousands of ops at many devices takes seconds to tens of seconds,
PipeDream and Piper up to their time limits, and a ranking by simulation of many micro-batches a few
seconds more. So the planners report after each micro-batch size they have searched, and the ranking
after each candidate it has simulated, as a `PlanProgress`: which phase, how many of how many done.
Without a callback nothing is reported and nothing is computed for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PlanProgress:
    """`done` of `total` steps of `phase` (a search over micro-batch sizes, or the ranking); `detail` names the
    last step ("micro-batch 8"). A phase starts with done = 0 and ends with done = total."""

    phase: str
    done: int
    total: int
    detail: str = ""


PlanProgressFn = Callable[[PlanProgress], None]
SizeDone = Callable[[int], None]  # called with the micro-batch size of a step done


def size_steps(progress: PlanProgressFn | None, phase: str, total: int, refined: bool = False) -> SizeDone | None:
    """What a phase of `total` steps, one per micro-batch size (a search) or per candidate plan (the ranking),
    calls with the step's micro-batch size once it is done, reporting `phase` to `progress` ("auto"'s
    refinement, `refined`, says so in the phase); None (report nothing) without a callback
    (`PlanRequest.size_steps`)."""
    if progress is None:
        return None
    if refined:
        phase = f"{phase} (refined)"
    done = 0
    progress(PlanProgress(phase, 0, total))

    def size_done(size: int) -> None:
        nonlocal done
        done += 1
        progress(PlanProgress(phase, done, total, f"micro-batch {size}"))

    return size_done
