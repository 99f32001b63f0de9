"""The parallel DP over runs of sorted branches as arrays (`sp_dp.runs`) against the loop it replaces: the loop
over sub-problems, runs and cells written out, with its strict improvements as the choices."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graphpipe.planner.api import make_request
from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.need import GroupChoice
from graphpipe.planner.sp_dp.runs import fewest_per_run, solve_runs
from graphpipe.planner.sp_dp.size_tables import SizeTables
from graphpipe.planner.sp_dp.tables import build_tables
from tests.planner.factories import make_cluster, make_costs, make_graph

Need = dict[int, list[int]]
Choice = dict[int, list[GroupChoice | None]]


def loop_fewest(tps: np.ndarray, k_max: np.ndarray, degrees: tuple[int, ...], target: float, held: int,
                start: int, stop: int) -> int:
    """The first degree, fewest first, on which run [start, stop) meets the target and holds `held`."""
    for pos, degree in enumerate(degrees):
        if tps[start, stop, pos] <= target and k_max[start, stop, pos] >= held:
            return degree
    return BIG


def loop_runs(tps: np.ndarray, k_max: np.ndarray, degrees: tuple[int, ...], target: float, chains: list[list[int]],
              base: list[int], k_after: int, num_devices: int, prefixes: bool) -> tuple[Need, Choice]:
    """Per sub-problem (suffixes, or prefixes), per run in the loop's order, per cell: keep strict improvements."""
    count, width = len(chains), len(base)
    full = (1 << count) - 1
    need: Need = {0: base}
    choice: Choice = {0: [None] * width}
    masks = ([(1 << size) - 1 for size in range(1, count + 1)] if prefixes else
             [full & ~((1 << pos) - 1) for pos in range(count - 1, -1, -1)])
    for mask in masks:
        row, chosen = [BIG] * width, [None] * width  # type: list[int], list[GroupChoice | None]
        if prefixes:
            runs = [(start, mask.bit_length()) for start in range(mask.bit_length())]  # longest first
        else:
            low = (mask & -mask).bit_length() - 1
            runs = [(low, stop) for stop in range(low + 1, count + 1)]  # shortest first
        for start, stop in runs:
            group = (1 << stop) - (1 << start)
            rest = need[mask ^ group]
            if stop - start == 1:
                costs, devices = [chains[start][v] + rest[v] for v in range(width)], 0
            else:
                devices = loop_fewest(tps, k_max, degrees, target, k_after + 1, start, stop)
                if devices >= BIG:
                    if not prefixes:
                        break
                    continue
                costs = [devices + rest[v] for v in range(width)]
            for v in range(k_after + 1, width):
                if costs[v] < row[v]:
                    row[v], chosen[v] = costs[v], (group, devices)
        need[mask] = [cost if cost <= num_devices else BIG for cost in row]
        choice[mask] = chosen
    return need, choice


def random_case(seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    count, num_devices = rng.randint(5, 9), rng.randint(2, 12)
    degrees = tuple(sorted(rng.sample(range(1, num_devices + 1), rng.randint(1, min(4, num_devices)))))
    width, size = num_devices + 2, count + 1
    tps = np.array([[[rng.choice([0.5, 1.0, 1.5, 2.0, 3.0, np.inf]) for _ in degrees] for _ in range(size)]
                    for _ in range(size)])
    k_max = np.array([[[rng.randint(-1, width) for _ in degrees] for _ in range(size)] for _ in range(size)],
                     dtype=np.int64)
    k_after = rng.randint(0, num_devices)
    chains = []
    for _ in range(count):
        first, value, vec = rng.randint(0, width), rng.randint(1, num_devices + 2), []
        for v in range(width):
            if v >= first and rng.random() < 0.3:
                value = max(1, value - 1)
            vec.append(BIG if v < first else value)
        chains.append(vec)
    bypass = rng.random() < 0.3
    return dict(tps=tps, k_max=k_max, degrees=degrees, target=rng.choice([1.0, 1.5, 2.0, 2.5]), chains=chains,
                base=[0 if (v >= k_after or not bypass) else BIG for v in range(width)], k_after=k_after,
                num_devices=num_devices)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), prefixes=st.booleans())
def test_runs_as_arrays_equal_the_loop(seed: int, prefixes: bool) -> None:
    case = random_case(seed)
    tps, k_max, degrees, target = case["tps"], case["k_max"], case["degrees"], case["target"]
    chains, base, k_after, num_devices = case["chains"], case["base"], case["k_after"], case["num_devices"]
    assert isinstance(tps, np.ndarray) and isinstance(k_max, np.ndarray) and isinstance(degrees, tuple)
    assert isinstance(target, float) and isinstance(chains, list) and isinstance(base, list)
    assert isinstance(k_after, int) and isinstance(num_devices, int)
    need, choice = loop_runs(tps, k_max, degrees, target, chains, base, k_after, num_devices, prefixes)
    fewest = fewest_per_run(tps, k_max, degrees, target, k_after + 1, cut_after_first_miss=not prefixes)
    sol = solve_runs(fewest, np.array(chains, dtype=np.int64), base, k_after, num_devices, prefixes)
    assert sol.need() == need
    for mask, row in need.items():
        for v, devices in enumerate(row):
            if mask and devices <= num_devices:
                assert sol.pick(mask, v) == choice[mask][v]


def test_a_run_past_one_that_fits_nowhere_is_not_tried_in_the_suffixes() -> None:
    """Run [0, 3) fits on no degree; [0, 4) would: the suffixes never try it, the prefixes do."""
    tps = np.full((5, 5, 1), 1.0)
    tps[0, 3, 0] = np.inf
    k_max = np.full((5, 5, 1), 5, dtype=np.int64)
    cut = fewest_per_run(tps, k_max, (2,), 1.0, 1, cut_after_first_miss=True)
    kept = fewest_per_run(tps, k_max, (2,), 1.0, 1, cut_after_first_miss=False)
    assert cut[0, 2] == kept[0, 2] == 2 and cut[0, 4] == BIG and kept[0, 4] == 2 and cut[0, 3] == kept[0, 3] == BIG
    assert cut[1, 4] == 2 and cut[0, 1] == BIG  # other starts keep their runs; one branch is never a merged run


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_devices=st.sampled_from([4, 8, 32]),
       memory_gib=st.sampled_from([0.01, 0.05, 0.5, 16.0]), latency_us=st.sampled_from([0.0, 3.7]))
def test_run_options_are_the_group_options(seed: int, num_devices: int, memory_gib: float, latency_us: float) -> None:
    """Every run's (TPS, most in flight) per degree as arrays equals `group_options`' scalars, bit for bit, on
    branches of random lengths and costs that all read one producer (a run receives it once), at every size."""
    rng = random.Random(seed)
    count = rng.randint(5, 9)
    preds: dict[str, tuple[str, ...]] = {"x": (), "shared": ("x",)}
    for r in range(count):
        prev = "shared"
        for idx in range(rng.randint(1, 4)):
            preds[f"b{r}_{idx}"] = (prev,)
            prev = f"b{r}_{idx}"
    preds["cat"] = tuple(name for name in preds if name.startswith("b") and not any(
        name in reads for other, reads in preds.items() if other.startswith("b")))
    graph = make_graph(preds)
    ops = [op.name for op in graph.ops]
    costs = make_costs(graph, {op: rng.choice([0.1, 0.3, 0.7, 1.3]) for op in ops}, overhead_ms=rng.random() / 7,
                       act_bytes={op: rng.randint(1, 3 << 20) for op in ops},
                       param_bytes={op: rng.randint(0, 5 << 20) for op in ops}, output_bytes=rng.randint(1, 1 << 16))
    cluster = make_cluster(num_devices, latency_us=latency_us)
    request = make_request(graph, costs, cluster, 64, memory_limit=memory_gib * 2**30)
    _, pars = build_tables(request.model, request.sp_tree)
    wide = [pinfo for pinfo in pars if pinfo.interval]
    assert wide, "the graph has a block of runs"
    for size in request.micro_batch_sizes:
        tables = SizeTables(request.model, num_devices, size, request.memory_limit)
        for pinfo in wide:
            tps, k_max = tables.run_options(pinfo)
            for start in range(len(pinfo.branch_infos) - 1):
                for stop in range(start + 2, len(pinfo.branch_infos) + 1):
                    options = tables.group_options(pinfo, (1 << stop) - (1 << start))
                    assert tps[start, stop].tolist() == ([o[1] for o in options] or [np.inf] * len(tables.degrees))
                    assert k_max[start, stop].tolist() == ([o[2] for o in options] or [-1] * len(tables.degrees))
