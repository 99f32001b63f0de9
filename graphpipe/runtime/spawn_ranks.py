"""Start ranks in spawned processes and collect what they report (host calibration, the GPU check's scripts).

Each rank runs `target(rank, world, port, *args, queue)` in a spawned process (CUDA cannot cross a fork),
joined by a TCP store on `port`, and puts tuples `(kind, rank, ..., payload)` on the queue, ending with
`("done", rank, ...)`; `("error", rank, ..., text)` fails the run with the rank's traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

WAIT_S = 600.0  # the longest a rank may stay silent (`make gpu-check` runs its scripts under `timeout` too)


def run_ranks(world: int, target: Callable[..., None], args: tuple[Any, ...],
              wait_s: float = WAIT_S) -> list[tuple[Any, ...]]:
    """Every message the ranks put, other than their "done", once each rank is done."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, world, store.port, *args, out), daemon=True)
             for rank in range(world)]
    for proc in procs:
        proc.start()
    messages: list[tuple[Any, ...]] = []
    done = 0
    try:
        while done < world:
            try:
                message = out.get(timeout=wait_s)
            except queue.Empty:
                raise RuntimeError(f"no rank reported for {wait_s:.0f} s") from None
            if message[0] == "error":
                raise RuntimeError(f"rank {message[1]} failed:\n{message[-1]}")
            if message[0] == "done":
                done += 1
            else:
                messages.append(message)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return messages
