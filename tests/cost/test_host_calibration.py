"""The host fit recovers the terms it models, and applying it scales the op costs and keeps the device's shape."""

from __future__ import annotations

import dataclasses

import pytest

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.cost.formulas.time_per_sample import ADAM_PASSES
from graphpipe.cost.host_calibration import HostCalibration, SizeTiming, call_part_ms, fit_host
from graphpipe.cost.presets import DEVICE_PRESETS
from graphpipe.errors import CostError
from tests.cost.graphs import mlp_graph

SCALE, FWD_CALL, BWD_CALL, FWD_US, BWD_US, STEP_US = 1.3, 0.9, 0.7, 120.0, 80.0, 900.0
PARAM_BYTES = 4_000_000
# per op: (forward per call, per sample), (backward per call, per sample), in ms
LINES = {"a": ((0.05, 0.1), (0.08, 0.2)), "b": ((0.02, 0.3), (0.03, 0.6))}


def profile_table() -> CostTable:
    """Two ops whose times are a per-call part plus a part that grows with the micro-batch."""
    entries = {name: {size: OpCost(fwd_ms=fwd[0] + fwd[1] * size, bwd_ms=bwd[0] + bwd[1] * size, act_bytes=0,
                                   output_bytes=0, param_bytes=PARAM_BYTES // 2) for size in (1, 2, 4, 8)}
               for name, (fwd, bwd) in LINES.items()}
    return CostTable(device="cpu", source="measured", entries=entries)


def timings_from_the_model(table: CostTable, rank_ops: tuple[tuple[str, ...], ...] = (("a",), ("b",)),
                           overheads: tuple[float, float] = (FWD_US, BWD_US)) -> list[list[SizeTiming]]:
    """What the workers (one per entry of `rank_ops`, each running those ops) measure when the host is exactly
    the fitted model."""
    device = DEVICE_PRESETS["cpu"]
    workers = []
    for ops in rank_ops:
        stream_ms = ADAM_PASSES * PARAM_BYTES // 2 * len(ops) / (device.mem_bandwidth_gb_per_s * 1e9) * 1e3
        rows = []
        for size in (1, 2, 4, 8):
            (fwd_call, fwd_sample), (bwd_call, bwd_sample) = (
                (sum(LINES[op][kind][0] for op in ops), sum(LINES[op][kind][1] * size for op in ops))
                for kind in (0, 1))
            rows.append(SizeTiming(micro_batch_size=size, ops=ops,
                                   fwd_ms=SCALE * fwd_sample + FWD_CALL * fwd_call + overheads[0] / 1e3,
                                   bwd_ms=SCALE * bwd_sample + BWD_CALL * bwd_call + overheads[1] / 1e3,
                                   outside_ms=0.2, step_ms=STEP_US / 1e3 + stream_ms - 0.2,
                                   iteration_ms=10.0, iteration_spread=0.05))
        workers.append(rows)
    return workers


def test_an_ops_per_call_part_is_the_intercept_of_its_profiled_sizes() -> None:
    table = profile_table()
    assert call_part_ms(table.entries["a"], "fwd_ms") == pytest.approx(0.05)
    assert call_part_ms(table.entries["b"], "bwd_ms") == pytest.approx(0.03)
    assert call_part_ms({4: table.entries["a"][4]}, "fwd_ms") == 0.0  # one size: nothing tells it apart


def test_the_fit_recovers_the_scales_and_the_overheads() -> None:
    table = profile_table()
    host = fit_host(timings_from_the_model(table), table, DEVICE_PRESETS["cpu"], call_shrinkage=0.0)
    assert host.compute_scale == pytest.approx(SCALE)
    assert host.call_scales == pytest.approx((FWD_CALL, BWD_CALL))
    assert host.fwd_action_overhead_us == pytest.approx(FWD_US)
    assert host.bwd_action_overhead_us == pytest.approx(BWD_US)
    assert host.step_overhead_us == pytest.approx(STEP_US)
    assert host.median_rel_error == pytest.approx(0.0, abs=1e-9)
    assert host.workers == 2 and host.iteration_spread == pytest.approx(0.05)


def test_the_call_scales_are_shrunk_toward_the_per_sample_scale() -> None:
    """By default a per-call scale departs from the per-sample scale only as far as the actions pay for it:
    closer than the unshrunk fit, on the same side."""
    table = profile_table()
    exact = fit_host(timings_from_the_model(table), table, DEVICE_PRESETS["cpu"], call_shrinkage=0.0)
    shrunk = fit_host(timings_from_the_model(table), table, DEVICE_PRESETS["cpu"])
    for loose, tight in zip(exact.call_scales, shrunk.call_scales):
        assert loose < exact.compute_scale
        assert 0 < shrunk.compute_scale - tight < exact.compute_scale - loose


def test_one_worker_holds_the_overheads_at_zero_and_fits_the_call_scales() -> None:
    """A lone worker runs one set of ops at every size: a per-action overhead cannot be told from the call
    scale, so the call scale carries both."""
    table = profile_table()
    host = fit_host(timings_from_the_model(table, (("a", "b"),), (0.0, 0.0)), table, DEVICE_PRESETS["cpu"],
                    call_shrinkage=0.0)
    assert host.fwd_action_overhead_us == host.bwd_action_overhead_us == 0.0
    assert (host.compute_scale, *host.call_scales) == pytest.approx((SCALE, FWD_CALL, BWD_CALL))


def test_workers_are_held_no_faster_than_one_worker_alone() -> None:
    """A workers' fit below the lone worker's scales (here the per-call part at half the lone one's) is held at
    the lone worker's, the rest refitted; without `alone` it is what the actions say."""
    table = profile_table()
    lone = fit_host(timings_from_the_model(table, (("a", "b"),), (0.0, 0.0)), table, DEVICE_PRESETS["cpu"],
                    call_shrinkage=0.0)

    def cheaper_calls(timing: SizeTiming) -> SizeTiming:
        fwd_call, bwd_call = (sum(LINES[op][kind][0] for op in timing.ops) for kind in (0, 1))
        return dataclasses.replace(timing, fwd_ms=timing.fwd_ms - FWD_CALL / 2 * fwd_call,
                                   bwd_ms=timing.bwd_ms - BWD_CALL / 2 * bwd_call)

    rows = [[cheaper_calls(timing) for timing in worker] for worker in timings_from_the_model(table)]
    free = fit_host(rows, table, DEVICE_PRESETS["cpu"], call_shrinkage=0.0)
    assert free.call_scales == pytest.approx((FWD_CALL / 2, BWD_CALL / 2))
    held = fit_host(rows, table, DEVICE_PRESETS["cpu"], alone=lone, call_shrinkage=0.0)
    assert held.call_scales == pytest.approx(lone.call_scales)
    assert held.compute_scale >= lone.compute_scale


def test_applying_it_scales_each_ops_per_call_and_per_sample_parts_apart() -> None:
    table = profile_table()
    host = fit_host(timings_from_the_model(table), table, DEVICE_PRESETS["cpu"], call_shrinkage=0.0)
    scaled = host.costs(table)
    for op, ((fwd_call, fwd_sample), (bwd_call, bwd_sample)) in LINES.items():
        for size in (1, 2, 4, 8):
            got = scaled.at(op, size)
            assert got.fwd_ms == pytest.approx(FWD_CALL * fwd_call + SCALE * fwd_sample * size)
            assert got.bwd_ms == pytest.approx(BWD_CALL * bwd_call + SCALE * bwd_sample * size)
            assert got.param_bytes == table.at(op, size).param_bytes


def test_an_overhead_the_fit_would_make_negative_is_held_at_zero() -> None:
    """Actions a fixed 10 us faster than the profile's sum at every size fit a negative overhead unconstrained: it
    is held at zero and the scales refitted alone."""
    table = profile_table()

    def faster(timing: SizeTiming) -> SizeTiming:
        fwd, bwd = (sum(getattr(table.at(op, timing.micro_batch_size), kind) for op in timing.ops)
                    for kind in ("fwd_ms", "bwd_ms"))
        return dataclasses.replace(timing, fwd_ms=fwd - 0.01, bwd_ms=bwd - 0.01)

    rows = [[faster(timing) for timing in worker] for worker in timings_from_the_model(table)]
    host = fit_host(rows, table, DEVICE_PRESETS["cpu"])
    assert host.fwd_action_overhead_us == host.bwd_action_overhead_us == 0.0
    assert 0.9 < host.compute_scale <= 1.0 and max(host.call_scales) < 1.0


def test_too_few_sizes_to_fit_is_an_error() -> None:
    table = profile_table()
    with pytest.raises(CostError, match="3 or more micro-batch sizes"):
        fit_host([timings_from_the_model(table)[0][:2]], table, DEVICE_PRESETS["cpu"])


def test_the_calibrated_device_scales_every_analytic_cost_by_the_compute_scale() -> None:
    """peak, elementwise peak and bandwidth divided, kernel overhead multiplied: every term of the roofline scales
    alike, so the analytic model's times scale exactly; the overheads ride on the device."""
    graph = mlp_graph()
    base = DEVICE_PRESETS["cpu"]
    host = HostCalibration(workers=2, compute_scale=1.25, fwd_action_overhead_us=10.0, bwd_action_overhead_us=20.0,
                           step_overhead_us=30.0, median_rel_error=0.0, iteration_spread=0.0)
    device = host.device(base)
    assert device.host_calibrated and device.name == "cpu-host"
    plain, slowed = analytic_costs(graph, base), analytic_costs(graph, device)
    for op, per_size in plain.entries.items():
        for size, cost in per_size.items():
            assert slowed.entries[op][size].fwd_ms == pytest.approx(1.25 * cost.fwd_ms)
            assert slowed.entries[op][size].bwd_ms == pytest.approx(1.25 * cost.bwd_ms)
    scaled = host.costs(plain)  # no call scales fitted: each op's two parts scale alike
    for op, per_size in slowed.entries.items():
        for size, cost in per_size.items():
            assert (scaled.entries[op][size].fwd_ms, scaled.entries[op][size].bwd_ms) == pytest.approx(
                (cost.fwd_ms, cost.bwd_ms))
            assert scaled.entries[op][size].act_bytes == cost.act_bytes


def test_actions_that_do_not_follow_the_ops_are_refused_with_the_fix() -> None:
    """A model whose ops are lost in the per-action overheads (the same time at every size) pins no scale."""
    table = profile_table()
    flat = [[dataclasses.replace(timing, fwd_ms=1.0, bwd_ms=1.0) for timing in worker]
            for worker in timings_from_the_model(table)]
    with pytest.raises(CostError, match="calibrate with a larger model"):
        fit_host(flat, table, DEVICE_PRESETS["cpu"])


def test_a_measured_step_bandwidth_moves_the_streaming_out_of_the_fixed_step() -> None:
    """With Adam's streaming measured (slower than the fitted device's memory), the step's fixed part is what is
    left of the same measured step; the device carries the bandwidth, so the reference's step is reproduced and
    another model's step scales with its own parameter bytes (`time_per_sample.optimizer_step_ms`)."""
    from graphpipe.cost.formulas.time_per_sample import optimizer_step_ms

    table, device = profile_table(), DEVICE_PRESETS["cpu"]
    host = fit_host(timings_from_the_model(table, (("a", "b"),), (0.0, 0.0)), table, device,
                    step_bandwidth_gb_per_s=15.0)
    stream = {bandwidth: ADAM_PASSES * PARAM_BYTES / (bandwidth * 1e9) * 1e3
              for bandwidth in (device.mem_bandwidth_gb_per_s, 15.0)}
    measured_ms = STEP_US / 1e3 + stream[device.mem_bandwidth_gb_per_s]  # what the workers' steps took
    assert host.step_overhead_us == pytest.approx(1e3 * (measured_ms - stream[15.0]))
    calibrated = host.device(device)
    assert calibrated.step_bandwidth_gb_per_s == 15.0
    assert optimizer_step_ms(calibrated, PARAM_BYTES) == pytest.approx(measured_ms)
    assert optimizer_step_ms(calibrated, 0) == pytest.approx(host.step_overhead_us / 1e3)
