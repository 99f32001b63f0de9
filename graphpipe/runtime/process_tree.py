"""Stop a process and everything under it: torchrun and the workers it started in sessions of their own.

A process group does not reach processes that started their own session, so the tree is read from
/proc (empty where there is none) and each process is signalled only while it is still the process
that was found (same start time), never a reused id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

__all__ = ["stop_process_tree"]

_GRACE_S = 5.0  # after SIGTERM, how long torchrun and the workers get before SIGKILL


def stop_process_tree(proc: subprocess.Popen[bytes], grace_s: float = _GRACE_S) -> None:
    """SIGTERM torchrun and every process under it (the workers run in sessions of their own, so torchrun's
    process group does not reach them), then SIGKILL whatever is left after `grace_s`."""
    tree = _descendants(proc.pid)
    _signal(proc, tree, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    _signal(proc, tree | _descendants(proc.pid), signal.SIGKILL)
    proc.wait()


def _signal(proc: subprocess.Popen[bytes], tree: set[tuple[int, int]], sig: signal.Signals) -> None:
    """Send `sig` to torchrun's process group while torchrun is unreaped (its id cannot have been reused),
    and to each (pid, start time) in `tree` that is still that process."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
    for pid, started in tree:
        if _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _descendants(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of every process under `root`, from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        stat = _stat_fields(int(entry.name))
        if stat is not None:
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found: set[tuple[int, int]] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        started = _start_time(pid)
        if started is not None:
            found.add((pid, started))
        stack.extend(children.get(pid, ()))
    return found


def _start_time(pid: int) -> int | None:
    stat = _stat_fields(pid)
    return int(stat[19]) if stat is not None else None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from the state field on (index 0 state, 1 ppid, 19 start time), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()
