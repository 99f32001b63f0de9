"""The gloo transport between two single-threaded worker processes of this host, measured.

- `measure_link`: point-to-point, a ping-pong of small and large tensors: latency = half the small round
  trip; bandwidth = large bytes / (half the large round trip - latency).
- `measure_all_reduce`: gloo's all-reduce of small and large tensors over the two processes, as the `Link`
  on which the planner's ring formula (2 (d - 1) / d x bytes / bandwidth + 2 (d - 1) x latency, d = 2)
  gives those times. Over loopback it is slower than the point-to-point link says (gloo's reduction
  runs on the host, in chunks), and a data-parallel stage pays it every iteration.

Each time is the lower quartile of its repeats: other processes on the machine only ever delay them.
"""

from __future__ import annotations

import statistics
import time
import traceback
from datetime import timedelta
from typing import Any

from graphpipe.cost.cluster import Link
from graphpipe.errors import CostError
from graphpipe.runtime.spawn_ranks import run_ranks

SMALL_FLOATS, LARGE_FLOATS = 256, 4 * 2**20  # 1 KiB and 16 MiB of float32
SMALL_REPS, LARGE_REPS = 200, 8


def measure_link(tries: int = 3) -> Link:
    """Loopback gloo point-to-point: the quietest of `tries` ping-pongs (by latency)."""
    links = [_as_link("gloo-loopback-measured", *_run_pair("ping")) for _ in range(tries)]
    return min(links, key=lambda link: link.latency_us)


def measure_all_reduce(tries: int = 3) -> Link:
    """Loopback gloo all-reduce over two processes, as the ring formula's link: the quietest of `tries`."""
    links = [_ring_link(*_run_pair("all_reduce")) for _ in range(tries)]
    return min(links, key=lambda link: link.latency_us)


def _as_link(name: str, small_s: float, large_s: float) -> Link:
    """A ping-pong's round trips as a link: one way is half a round trip."""
    latency_s = small_s / 2
    bandwidth = LARGE_FLOATS * 4 / max(large_s / 2 - latency_s, 1e-9)
    return Link(name=name, latency_us=latency_s * 1e6, bandwidth_gb_per_s=bandwidth / 1e9)


def _ring_link(small_s: float, large_s: float) -> Link:
    """The link on which a two-device ring (2 latencies + bytes / bandwidth) takes the measured times."""
    latency_s = small_s / 2
    bandwidth = LARGE_FLOATS * 4 / max(large_s - small_s, 1e-9)
    return Link(name="gloo-all-reduce-measured", latency_us=latency_s * 1e6, bandwidth_gb_per_s=bandwidth / 1e9)


def _run_pair(what: str) -> tuple[float, float]:
    """(small, large) seconds of `what` between two fresh single-threaded processes."""
    try:
        (_, _, (small, large)), = run_ranks(2, _pair_main, (what,), wait_s=300)
    except RuntimeError as err:
        raise CostError(f"measuring the loopback {what} failed: {err}") from None
    return float(small), float(large)


def _pair_main(rank: int, world: int, port: int, what: str, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,  # type: ignore[attr-defined]
                              timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
        once = _round_trip if what == "ping" else _all_reduce
        _timed(once, rank, SMALL_FLOATS, 20)  # warm-up: connections, allocations
        result = (_timed(once, rank, SMALL_FLOATS, SMALL_REPS), _timed(once, rank, LARGE_FLOATS, LARGE_REPS))
        if rank == 0:
            out.put(("times", rank, result))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
    out.put(("done", rank))


def _timed(once: Any, rank: int, numel: int, reps: int) -> float:
    import torch

    buf = torch.zeros(numel)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        once(rank, buf)
        times.append(time.perf_counter() - start)
    return statistics.quantiles(times, n=4)[0]


def _round_trip(rank: int, buf: Any) -> None:
    import torch.distributed as dist

    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    else:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def _all_reduce(rank: int, buf: Any) -> None:
    import torch.distributed as dist

    dist.all_reduce(buf)
