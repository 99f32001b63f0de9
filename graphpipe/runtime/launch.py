"""Start `python -m graphpipe.train` on this machine with torchrun, and name the rank that failed.

torchrun stops every rank when one exits non-zero and prints a summary whose "Root
Cause" names the first failed rank and its exit code; `launch` passes the output through
and parses that summary (or a rank's own `rank R: error:` line) into a `LaunchResult`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
_FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
_RANK_ERROR = re.compile(r"graphpipe train: rank (\d+): error: (.*)")
_PEER_DIED = "probably died"  # how a rank says it failed only because a peer did (runtime/comm.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    returncode: int
    failed_rank: int | None = None
    rank_exitcode: int | None = None
    message: str = ""  # the failed rank's own error line, when it printed one

    def describe(self) -> str:
        """One sentence for the user: which rank failed and how."""
        if self.failed_rank is None:
            return f"torchrun exited with code {self.returncode}; see the log above"
        how = f"exit code {self.rank_exitcode}"
        if self.rank_exitcode is not None and self.rank_exitcode < 0:
            how = f"killed by {signal.Signals(-self.rank_exitcode).name}"
        detail = f": {self.message}" if self.message else ""
        return f"rank {self.failed_rank} failed ({how}){detail}; torchrun stopped the other ranks"


def torchrun_command(nproc: int, train_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.5", "-m", "graphpipe.train", *train_args]


def launch(nproc: int, train_args: Sequence[str], *, env: dict[str, str] | None = None) -> LaunchResult:
    """Run torchrun to completion, forwarding its output; parse the failure summary."""
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen(torchrun_command(nproc, train_args), stderr=subprocess.PIPE, env=child_env)
    assert proc.stderr is not None
    tail = ""
    while chunk := os.read(proc.stderr.fileno(), 65536):
        sys.stderr.write(chunk.decode(errors="replace"))
        sys.stderr.flush()
        tail = (tail + chunk.decode(errors="replace"))[-200_000:]
    returncode = proc.wait()
    return parse_failure(returncode, tail)


def parse_failure(returncode: int, output: str) -> LaunchResult:
    """The rank that failed first in fact: torchrun's "Root Cause" is the first failure it observed,
    and a rank killed by a signal or by its own error often exits after the peers it broke. So a rank
    killed by a signal wins, then a rank whose error is its own (not "rank K probably died"), then
    torchrun's choice."""
    if returncode == 0:
        return LaunchResult(returncode=0)
    messages = {int(rank): text.strip() for rank, text in _RANK_ERROR.findall(output)}
    codes = {int(rank): int(code) for rank, code in _FAILURE.findall(output)}
    root = _ROOT_CAUSE.search(output)
    order = [int(root[1])] if root else []
    order += sorted(codes)
    signalled = [rank for rank in order if codes.get(rank, 0) < 0]
    own = [rank for rank in order if rank in messages and _PEER_DIED not in messages[rank]]
    candidates = signalled or own or order or sorted(messages)
    if not candidates:
        return LaunchResult(returncode=returncode)
    chosen = candidates[0]
    return LaunchResult(returncode=returncode, failed_rank=chosen, rank_exitcode=codes.get(chosen),
                        message=messages.get(chosen, ""))
