"""Communication time on a link (plain arithmetic on `Link`'s latency and bandwidth).

    p2p        = 2 × (messages × latency + bytes / bandwidth)      activations forward, gradients backward
    all-reduce = 2 (d - 1) / d × bytes / bandwidth + 2 (d - 1) × latency    a ring over d devices; free when d = 1
    piece      = latency + bytes / bandwidth + (tensors - 1) × latency    one rank-to-rank piece of a stage edge

Times are in ms, latencies in µs, bandwidths in GB/s. The `_array` twins evaluate the same
expressions elementwise, operation for operation, so they equal the scalar versions bit for bit.
"""

from __future__ import annotations

import numpy as np

from graphpipe.cost.cluster import Link


def p2p_ms(link: Link, num_messages: int, num_bytes: float) -> float:
    """Activations forward plus gradients backward for one micro-batch: `num_messages` tensors of `num_bytes`
    in all, each way."""
    if num_messages <= 0:
        return 0.0
    return 2 * (num_messages * link.latency_us / 1e3 + num_bytes / (link.bandwidth_gb_per_s * 1e9) * 1e3)


def p2p_ms_array(link: Link, num_messages: np.ndarray, num_bytes: np.ndarray) -> np.ndarray:
    """`p2p_ms` elementwise (`num_messages` broadcast against `num_bytes`). `num_bytes` is overwritten with the
    result: the DP's tables are large."""
    out = num_bytes
    out /= link.bandwidth_gb_per_s * 1e9
    out *= 1e3
    out += num_messages * link.latency_us / 1e3
    out *= 2
    np.copyto(out, 0.0, where=~(num_messages > 0))
    return out


def ring_all_reduce_ms(link: Link, grad_bytes: float, num_devices: int) -> float:
    """A ring all-reduce of `grad_bytes` over `num_devices` devices on `link`; free for one device or no bytes."""
    if num_devices <= 1 or grad_bytes <= 0:
        return 0.0
    steps = 2 * (num_devices - 1)
    return steps / num_devices * grad_bytes / (link.bandwidth_gb_per_s * 1e9) * 1e3 + steps * link.latency_us / 1e3


def ring_all_reduce_line(link: Link, num_devices: int) -> tuple[float, float]:
    """(ms per byte, fixed ms) of `ring_all_reduce_ms` for any positive byte count: the same expression as a line,
    for bounds that search over byte counts (equal to it up to rounding; (0, 0) for one device)."""
    if num_devices <= 1:
        return 0.0, 0.0
    steps = 2 * (num_devices - 1)
    return steps / num_devices / (link.bandwidth_gb_per_s * 1e9) * 1e3, steps * link.latency_us / 1e3


def ring_all_reduce_ms_array(link: Link, grad_bytes: np.ndarray, num_devices: int) -> np.ndarray | float:
    """`ring_all_reduce_ms` elementwise over `grad_bytes` (a plain 0.0 for one device)."""
    if num_devices <= 1:
        return 0.0
    steps = 2 * (num_devices - 1)
    return np.where(grad_bytes > 0, steps / num_devices * grad_bytes / (link.bandwidth_gb_per_s * 1e9) * 1e3
                    + steps * link.latency_us / 1e3, 0.0)


def piece_ms(link: Link, num_bytes: float, num_tensors: int = 1) -> float:
    """One rank-to-rank piece of a stage edge: the runtime sends each crossing tensor as its own message, so
    every tensor after the first adds a latency."""
    return link.transfer_ms(num_bytes) + (max(1, num_tensors) - 1) * link.latency_us / 1e3
