"""Waiting on other processes by their progress, not by a wall clock tuned for a quiet machine.

A run is stuck when its processes stop computing: a rank blocked on a message it will never get uses no
CPU. On a loaded machine a healthy run is only slower: its processes still get CPU time. So a wait here fails
when the watched processes used less than `MIN_PROGRESS_S` CPU-seconds in the last `QUIET_S` seconds (a
launcher's polling costs less), or after `HARD_S` in all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

QUIET_S = 120.0
MIN_PROGRESS_S = 1.0
HARD_S = 1500.0
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float:
    """User and system CPU time of `pids` (those still there)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def descendants(root: int) -> list[int]:
    """`root` and every process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += parents.get(pid, [])
    return found


class Progress:
    """`stalled()` is true once `pids()` used under MIN_PROGRESS_S of CPU in QUIET_S seconds, or after HARD_S."""

    def __init__(self, pids: Callable[[], Sequence[int]], *, quiet_s: float = QUIET_S, hard_s: float = HARD_S) -> None:
        self.pids, self.quiet_s, self.hard_s = pids, quiet_s, hard_s
        self.start = self.mark = time.monotonic()
        self.cpu_at_mark = cpu_seconds(pids())

    def stalled(self) -> bool:
        now = time.monotonic()
        if cpu_seconds(self.pids()) - self.cpu_at_mark >= MIN_PROGRESS_S:
            self.mark, self.cpu_at_mark = now, cpu_seconds(self.pids())
        return now - self.mark > self.quiet_s or now - self.start > self.hard_s

    def why(self) -> str:
        return (f"no progress: under {MIN_PROGRESS_S} CPU-second in {self.quiet_s:.0f} s" if
                time.monotonic() - self.start <= self.hard_s else f"still running after {self.hard_s:.0f} s")


def run_watched(command: Sequence[str], **popen: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(command, capture_output=True, text=True)`, ended (and its process tree killed) only when
    it stops making progress; raises AssertionError then, with the tail of its output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(command), stdout=out, stderr=err, text=True, **popen)
        progress = Progress(lambda: descendants(proc.pid))
        while proc.poll() is None:
            if progress.stalled():
                kill_tree(proc.pid)
                proc.wait()
                err.seek(0)
                raise AssertionError(f"{' '.join(command[:6])} ...: {progress.why()}:\n{err.read()[-3000:]}")
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def kill_tree(root: int) -> None:
    for pid in reversed(descendants(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
