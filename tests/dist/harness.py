"""Start one gloo process group per world size and run many checks in it (one start, many scenarios).

Each worker initialises gloo from a TCPStore the parent created on a free port, runs every
task, and reports each task's result (or its traceback) on a queue. Tasks are plain
tuples so that they pickle into spawned processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tests.waiting import QUIET_S, Progress

TIMEOUT_S = 300.0  # gloo: a peer may be slow to arrive on a loaded machine; the harness watches for a hang

Task = tuple[str, Callable[..., Any], tuple[Any, ...]]  # (task id, function(rank, *args) -> result, args)


def run_world(world_size: int, tasks: Sequence[Task], *, quiet_s: float = QUIET_S) -> dict[str, list[Any]]:
    """Run every task on every rank of a fresh gloo group; results[task id][rank]. Fails when the ranks stop
    making progress for `quiet_s` (`tests.waiting`), not after a fixed time: a loaded machine is only slower."""
    ctx = _context()
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, timeout=timedelta(seconds=TIMEOUT_S),
                          wait_for_workers=False)
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(rank, world_size, store.port, list(tasks), results), daemon=True)
             for rank in range(world_size)]
    for proc in procs:
        proc.start()
    out: dict[str, list[Any]] = {task_id: [None] * world_size for task_id, _, _ in tasks}
    progress = Progress(lambda: [proc.pid for proc in procs if proc.pid is not None], quiet_s=quiet_s)
    pending = world_size * len(tasks) + world_size
    try:
        while pending:
            try:
                kind, rank, task_id, payload = results.get(timeout=1.0)
            except queue.Empty:
                _check_alive(procs, world_size, progress)
                continue
            pending -= 1
            if kind == "error":
                raise AssertionError(f"rank {rank} failed in {task_id}:\n{payload}")
            if kind == "result":
                out[task_id][rank] = payload
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return out


def _context() -> Any:
    """A forkserver that imported torch, dynamo (Adam imports it) and the tasks once: fast rank starts."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "tests.dist.tasks"])
    return ctx


def _check_alive(procs: list[Any], world_size: int, progress: Progress) -> None:
    dead = [(rank, p.exitcode) for rank, p in enumerate(procs) if p.exitcode not in (None, 0)]
    if dead:
        raise AssertionError(f"world {world_size}: rank {dead[0][0]} exited with code {dead[0][1]}")
    if progress.stalled():
        raise AssertionError(f"world {world_size}: the ranks stopped: {progress.why()}")


def _worker(rank: int, world_size: int, port: int, tasks: list[Task], results: Any) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    task_id = "init"
    try:
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                              timeout=timedelta(seconds=TIMEOUT_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=TIMEOUT_S))
        for task_id, func, args in tasks:
            results.put(("result", rank, task_id, func(rank, *args)))
            dist.barrier()
        results.put(("done", rank, "", None))
        dist.destroy_process_group()
    except BaseException:
        results.put(("error", rank, task_id, traceback.format_exc()))
    results.close()
    results.join_thread()
    os._exit(0)  # skip interpreter teardown: seconds per rank on a loaded machine
