"""The cost formulas against their closed forms, and each numpy twin against its scalar version."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphpipe.cost.cluster import Device, Link
from graphpipe.cost.formulas.communication import (
    p2p_ms,
    p2p_ms_array,
    piece_ms,
    ring_all_reduce_line,
    ring_all_reduce_ms,
    ring_all_reduce_ms_array,
)
from graphpipe.cost.formulas.memory import (
    UNBOUNDED,
    max_in_flight_micro_batches,
    max_in_flight_micro_batches_array,
    static_memory_bytes,
)
from graphpipe.cost.formulas.sample_split import rank_share, share_blocks, share_size
from graphpipe.cost.formulas.time_per_sample import (
    ADAM_PASSES,
    iteration_ms_per_sample,
    iteration_ms_per_sample_array,
    optimizer_step_line,
    optimizer_step_ms,
    optimizer_step_ms_array,
    time_per_sample_floor,
    time_per_sample_ms,
    time_per_sample_ms_array,
    time_per_sample_ms_rows,
)

LINK = Link(name="test", latency_us=5.0, bandwidth_gb_per_s=25.0)
links = st.builds(Link, name=st.just("random"), latency_us=st.floats(0.0, 100.0),
                  bandwidth_gb_per_s=st.floats(0.1, 1000.0))
byte_counts = st.floats(0.0, 1e12)
overheads_us = st.floats(0.0, 5000.0) | st.just(0.0)
devices_with_overheads = st.builds(Device, name=st.just("random"), peak_tflops=st.just(100.0),
                                   mem_bandwidth_gb_per_s=st.floats(1.0, 4000.0), memory_bytes=st.just(1 << 34),
                                   kernel_overhead_us=st.just(0.0), fwd_action_overhead_us=overheads_us,
                                   bwd_action_overhead_us=overheads_us, step_overhead_us=overheads_us)
DEVICE = Device(name="test", peak_tflops=100.0, mem_bandwidth_gb_per_s=700.0, memory_bytes=1 << 34,
                kernel_overhead_us=0.0, fwd_action_overhead_us=250.0, bwd_action_overhead_us=750.0,
                step_overhead_us=2000.0)
whole_bytes = st.integers(0, 2**40)


def _seconds_to_ms(seconds: float) -> float:
    return seconds * 1e3


# ---- closed forms ---------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [2, 3, 4, 8, 64])
def test_ring_all_reduce_is_two_passes_of_n_minus_one_steps(devices: int) -> None:
    grad_bytes = 3e8
    latency_s, bandwidth = LINK.latency_us * 1e-6, LINK.bandwidth_gb_per_s * 1e9
    expected = 2 * (devices - 1) / devices * grad_bytes / bandwidth + 2 * (devices - 1) * latency_s
    assert ring_all_reduce_ms(LINK, grad_bytes, devices) == pytest.approx(_seconds_to_ms(expected), rel=1e-12)


def test_ring_all_reduce_is_free_on_one_device_or_without_bytes() -> None:
    assert ring_all_reduce_ms(LINK, 1e9, 1) == 0.0
    assert ring_all_reduce_ms(LINK, 0, 8) == 0.0


@given(link=links, grad_bytes=st.floats(1.0, 1e12), devices=st.integers(1, 1024))
def test_ring_all_reduce_is_its_line_for_any_bytes(link: Link, grad_bytes: float, devices: int) -> None:
    """`ring_all_reduce_line` is the all-reduce as slope x bytes + fixed, for any positive byte count."""
    slope, fixed = ring_all_reduce_line(link, devices)
    assert slope * grad_bytes + fixed == pytest.approx(ring_all_reduce_ms(link, grad_bytes, devices), rel=1e-12)


def test_p2p_sends_activations_forward_and_gradients_backward() -> None:
    messages, num_bytes = 3, 4e6
    expected = 2 * (messages * LINK.latency_us * 1e-6 + num_bytes / (LINK.bandwidth_gb_per_s * 1e9))
    assert p2p_ms(LINK, messages, num_bytes) == pytest.approx(_seconds_to_ms(expected), rel=1e-12)
    assert p2p_ms(LINK, 0, num_bytes) == 0.0


def test_a_piece_pays_one_latency_per_tensor() -> None:
    expected = 3 * LINK.latency_us * 1e-6 + 1e6 / (LINK.bandwidth_gb_per_s * 1e9)
    assert piece_ms(LINK, 1e6, num_tensors=3) == pytest.approx(_seconds_to_ms(expected), rel=1e-12)
    assert piece_ms(LINK, 1e6, num_tensors=0) == piece_ms(LINK, 1e6) == LINK.transfer_ms(1e6)


def test_tps_spreads_the_micro_batch_over_b_and_the_all_reduce_and_step_over_the_mini_batch() -> None:
    """Actions (0.25 + 0.75 ms) per micro-batch; the step streams 7 x the weights and pays its 2 ms once."""
    compute, comm, reduce_ms, params, b, big_b = 12.0, 3.0, 40.0, 7e9, 4, 64
    step = ADAM_PASSES * 7e9 / 700e9 * 1e3 + 2.0
    assert optimizer_step_ms(DEVICE, params) == pytest.approx(72.0)
    assert time_per_sample_ms(DEVICE, compute, comm, reduce_ms, params, b, big_b) == pytest.approx(
        (12 + 3 + 1.0) / 4 + (40 + step) / 64)


@given(params=whole_bytes, act=st.integers(1, 2**30), limit=whole_bytes, micro_batches=st.integers(1, 64))
def test_in_flight_cap_is_the_most_micro_batches_that_fit(params: int, act: int, limit: int,
                                                          micro_batches: int) -> None:
    cap = max_in_flight_micro_batches(params, act, limit, micro_batches)
    static = 4 * params
    assert static_memory_bytes(params) == static
    if static > limit:
        assert cap == -1
        return
    most = (limit - static) // act  # the largest k with static + k × act <= limit
    assert static + most * act <= limit < static + (most + 1) * act
    assert cap == (UNBOUNDED if most >= micro_batches else most)
    assert max_in_flight_micro_batches(params, act, limit) == most


def test_in_flight_cap_without_activations_is_unbounded() -> None:
    assert max_in_flight_micro_batches(10, 0, 100) == UNBOUNDED
    assert max_in_flight_micro_batches(25, 0, 100) == UNBOUNDED  # no spare byte, still nothing to hold


# ---- numpy twins ----------------------------------------------------------------------------


def _array(values: list[float], shape: tuple[int, ...]) -> np.ndarray:
    return np.resize(np.array(values, dtype=float), shape)


@given(link=links, grad=st.lists(byte_counts | st.just(0.0), min_size=1, max_size=30),
       devices=st.integers(1, 64))
def test_ring_all_reduce_twin_equals_scalar(link: Link, grad: list[float], devices: int) -> None:
    twin = np.broadcast_to(ring_all_reduce_ms_array(link, np.array(grad), devices), (len(grad),))
    assert twin.tolist() == [ring_all_reduce_ms(link, value, devices) for value in grad]


@given(link=links, messages=st.lists(st.integers(0, 12), min_size=4, max_size=4),
       num_bytes=st.lists(byte_counts, min_size=1, max_size=24))
def test_p2p_twin_equals_scalar(link: Link, messages: list[int], num_bytes: list[float]) -> None:
    msgs, nbytes = _array(messages, (2, 2)), _array(num_bytes, (3, 2, 2))  # degrees x segments, as the DP's
    twin = p2p_ms_array(link, msgs, nbytes.copy())
    expected = [[[p2p_ms(link, int(msgs[i, j]), nbytes[d, i, j]) for j in range(2)] for i in range(2)]
                for d in range(3)]
    assert twin.tolist() == expected


@given(device=devices_with_overheads, params=st.lists(whole_bytes, min_size=1, max_size=9))
def test_step_twin_equals_scalar_and_its_line(device: Device, params: list[int]) -> None:
    weights = _array(params, (3, 3))
    twin = optimizer_step_ms_array(device, weights)
    slope, fixed = optimizer_step_line(device)
    for value, got in zip(weights.ravel(), twin.ravel()):
        assert got == optimizer_step_ms(device, value)
        assert math.isclose(slope * value + fixed, got, rel_tol=1e-12)


@given(device=devices_with_overheads, compute=st.lists(st.floats(0.0, 1e4), min_size=1, max_size=12),
       comm=st.lists(st.floats(0.0, 1e4), min_size=1, max_size=12),
       reduce_ms=st.lists(st.floats(0.0, 1e5), min_size=2, max_size=2),
       params=st.lists(whole_bytes, min_size=1, max_size=3),
       b=st.sampled_from([1, 2, 4, 8, 16]), big_b=st.sampled_from([16, 64, 128]))
def test_tps_twins_equal_scalar_to_the_bit(device: Device, compute: list[float], comm: list[float],
                                           reduce_ms: list[float], params: list[int], b: int, big_b: int) -> None:
    """Both twins (by degree rows, as the segment tables call it, and elementwise, as the run, merge and baseline
    tables do) give the scalar's bits on the same inputs, overheads included."""
    per_micro_batch, comms, weights = _array(compute, (2, 3)), _array(comm, (2, 3)), _array(params, (3,))
    step = optimizer_step_ms_array(device, weights)
    per_iteration = [iteration_ms_per_sample_array(reduce_ms[d], step, big_b) for d in range(2)]
    rows = time_per_sample_ms_rows(device, per_micro_batch, comms.copy(), per_iteration, b)
    for d in range(2):
        plane = time_per_sample_ms_array(device, per_micro_batch[d], comms[d].copy(), per_iteration[d], b)
        for j in range(3):
            scalar = time_per_sample_ms(device, per_micro_batch[d, j], comms[d, j], reduce_ms[d], weights[j], b, big_b)
            assert rows[d, j] == plane[j] == scalar
            assert per_iteration[d][j] == iteration_ms_per_sample(reduce_ms[d], optimizer_step_ms(device, weights[j]),
                                                                  big_b)


@given(device=devices_with_overheads, link=links, devices=st.integers(1, 64), compute=st.floats(0.0, 1e4),
       comm=st.floats(0.0, 1e4), params=whole_bytes, b=st.sampled_from([1, 4, 16]), big_b=st.sampled_from([16, 128]))
def test_tps_floor_is_the_tps_without_its_p2p(device: Device, link: Link, devices: int, compute: float,
                                              comm: float, params: int, b: int, big_b: int) -> None:
    """`time_per_sample_floor` (the band's bound) is the rule less its p2p term, up to rounding."""
    any_fixed, per_byte, weighted_fixed = time_per_sample_floor(device, ring_all_reduce_line(link, devices), b, big_b)
    floor = compute / b + any_fixed + (per_byte * params + weighted_fixed if params > 0 else 0.0)
    exact = time_per_sample_ms(device, compute, 0.0, ring_all_reduce_ms(link, params, devices), params, b, big_b)
    assert math.isclose(floor, exact, rel_tol=1e-9, abs_tol=1e-12)
    assert floor <= time_per_sample_ms(device, compute, comm, ring_all_reduce_ms(link, params, devices), params, b,
                                       big_b) * (1 + 1e-9) + 1e-12


@settings(max_examples=200)
@given(params=st.lists(st.integers(0, 2**40), min_size=1, max_size=9),
       acts=st.lists(st.integers(0, 2**36), min_size=1, max_size=18),
       limit=st.integers(0, 2**44), micro_batches=st.integers(1, 64), cap=st.integers(1, 65))
def test_in_flight_cap_twin_equals_scalar_within_the_cap(params: list[int], acts: list[int], limit: int,
                                                        micro_batches: int, cap: int) -> None:
    weights, activations = _array(params, (3, 3)), _array(acts, (2, 3, 3))
    twin = max_in_flight_micro_batches_array(weights, activations.copy(), float(limit), micro_batches, cap)
    assert twin.dtype == np.int32  # the most the DP asks for is devices + 2: half the bytes of int64 on its tables
    for d in range(2):
        for i in range(3):
            for j in range(3):
                scalar = max_in_flight_micro_batches(weights[i, j], activations[d, i, j], limit, micro_batches)
                assert twin[d, i, j] == min(scalar, cap)


# ---- the per-rank sample split --------------------------------------------------------------

ranks_and_size = st.tuples(st.permutations(range(8)), st.integers(1, 8), st.integers(1, 5)).map(
    lambda t: (tuple(t[0][: t[1]]), t[1] * t[2]))  # (ranks, micro-batch size), d dividing b


@given(stage=ranks_and_size, micro_batches=st.integers(1, 6))
def test_rank_shares_cover_every_sample_exactly_once(stage: tuple[tuple[int, ...], int], micro_batches: int) -> None:
    ranks, b = stage
    samples = sorted(sample for m in range(micro_batches) for rank in ranks
                     for sample in range(*rank_share(b, ranks, rank, m)))
    assert samples == list(range(micro_batches * b))
    assert all(rank_share(b, ranks, rank, 0)[1] - rank_share(b, ranks, rank, 0)[0] == share_size(b, len(ranks))
               for rank in ranks)


@given(stage=ranks_and_size, micro_batches=st.integers(1, 6), cut=st.tuples(st.integers(0, 48), st.integers(0, 48)))
def test_share_blocks_cut_a_range_into_the_owners_shares(stage: tuple[tuple[int, ...], int], micro_batches: int,
                                                         cut: tuple[int, int]) -> None:
    ranks, b = stage
    start, stop = sorted(min(value, micro_batches * b) for value in cut)
    blocks = share_blocks(b, ranks, start, stop)
    assert [sample for _, a, z in blocks for sample in range(a, z)] == list(range(start, stop))
    for owner, a, z in blocks:
        own_start, own_stop = rank_share(b, ranks, owner, a // b)
        assert own_start <= a < z <= own_stop
