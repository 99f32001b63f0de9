"""A plan's progress on stderr: one bar per phase (`graphpipe.planner.progress`), such as

    graphpipe: stage graphs 3/8 [00:04], micro-batch 16

shown only on a terminal and only once a phase has run for `DELAY_S`: a quick plan prints nothing, and a log
gets no carriage returns. The bar is cleared when the phase ends, so the plan's own output follows cleanly.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import IO, Any

from graphpipe.planner.progress import PlanProgress

DELAY_S = 1.0
BAR_FORMAT = "{desc} {n}/{total} [{elapsed}]{postfix}"  # tqdm puts ", " before a postfix


class PlanProgressBar:
    """The `progress` callback of `gp.plan` (`PlanOptions.progress`) drawn with tqdm; a context manager that
    clears the last bar. `enabled`: None shows it only where `file` is a terminal (tqdm's test)."""

    def __init__(self, label: str, file: IO[str] | None = None, enabled: bool | None = None,
                 delay_s: float = DELAY_S) -> None:
        self.label = label
        self.file = file if file is not None else sys.stderr
        self.disable = None if enabled is None else not enabled
        self.delay_s = delay_s
        self._phase: str | None = None
        self._bar: Any = None

    def __call__(self, event: PlanProgress) -> None:
        if event.phase != self._phase:
            self.close()
            from tqdm import tqdm

            self._bar = tqdm(total=event.total, desc=f"{self.label}: {event.phase}", bar_format=BAR_FORMAT,
                             leave=False, file=self.file, disable=self.disable, delay=self.delay_s)
            self._phase = event.phase
        self._bar.set_postfix_str(event.detail, refresh=False)
        self._bar.update(event.done - self._bar.n)  # draws the line once the delay has passed, at most every 0.1 s

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._phase = None, None

    def __enter__(self) -> PlanProgressBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
