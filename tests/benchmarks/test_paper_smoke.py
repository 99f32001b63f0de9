"""The paper benchmark's core on tiny models: the output holds every experiment, and graphpipe never loses.

`benchmarks/paper/run.py --quick` runs the same experiments as the full benchmark on the tiny
presets in seconds; this test runs it once and checks the results file, the paper-regime
mini-batch search, the plots and that a graph pipeline plan is never slower than the best
sequential plan beyond the search's tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.scripts import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("paper/run.py", "paper_benchmark_run")


@pytest.fixture(scope="module")
def results(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("paper")
    bench.run_all(bench.QUICK, out)
    return json.loads((out / "results.json").read_text()), out


def runs_of(results: dict[str, Any], experiment: str) -> list[dict[str, Any]]:
    return [r for r in results["runs"] if r["experiment"] == experiment]


def test_every_experiment_and_planner_is_recorded(bench: ModuleType, results: tuple[dict[str, Any], Path]) -> None:
    data, _ = results
    setup = bench.QUICK
    assert data["format"] == bench.FORMAT
    assert {r["experiment"] for r in data["runs"]} == set(bench.EXPERIMENTS)
    for experiment in ("scaling", "paper_regime"):
        runs = runs_of(data, experiment)
        assert len(runs) == len(setup.models) * len(setup.device_counts) * len(setup.planners)
        assert {r["granularity"] for r in runs} == {setup.granularity}
    for r in runs_of(data, "scaling"):
        assert r["global_batch_size"] == setup.batch_per_device * r["num_devices"]
    assert {r["granularity"] for r in runs_of(data, "op_level")} == {"op"}
    assert {r["global_batch_size"] for r in runs_of(data, "batch")} == set(setup.sweep_batches)
    assert {r["planner"] for r in runs_of(data, "ablation")} == {"sequential", "parallel-only", "graphpipe"}
    assert {r["options"]["num_branches"] for r in runs_of(data, "branches")} == set(setup.branch_counts)
    sizes = {r["options"]["micro_batch"] for r in runs_of(data, "micro_batch")}
    assert sizes == {2**i for i in range(len(sizes))} and max(sizes) == setup.batch(setup.micro_batch_devices)
    assert set(data["tables"]) == {*bench.TABLES, "regime", "costs"}
    assert all(table.count("\n") >= 3 for table in data["tables"].values())  # title, header, rule, rows


def test_paper_regime_doubles_while_the_sequential_plan_fits(bench: ModuleType,
                                                             results: tuple[dict[str, Any], Path]) -> None:
    data, _ = results
    setup = bench.QUICK
    assert len(data["regimes"]) == len(setup.models) * len(setup.device_counts)
    for found in data["regimes"]:
        batches = [p["global_batch_size"] for p in found["probes"]]
        assert batches[0] == setup.batch(found["num_devices"])
        assert batches == [batches[0] * 2**i for i in range(len(batches))]
        assert all(p["fits"] for p in found["probes"][:-1])
        fitting = [p["global_batch_size"] for p in found["probes"] if p["fits"]]
        assert found["global_batch_size"] == fitting[-1] <= setup.batch_cap
        runs = [r for r in runs_of(data, "paper_regime")
                if r["model"] == found["model"] and r["num_devices"] == found["num_devices"]]
        assert {r["global_batch_size"] for r in runs} == {found["global_batch_size"]}
    head = data["headline"]
    assert {h["model"] for h in head["paper_regime"]} == {h["model"] for h in head["scaling"]} == set(setup.models)


def test_headline_states_each_mini_batch(bench: ModuleType, results: tuple[dict[str, Any], Path]) -> None:
    _, out = results
    text = (out / "HEADLINE.md").read_text()
    assert all(part in text for part in ("Paper's rule", "Capped regime", "Small regime", "holds by construction"))
    assert " at 256 |" in text  # each ratio with the mini-batch it holds at
    assert bench.rerender(out)  # --tables-only: the markdown again from results.json
    assert (out / "HEADLINE.md").read_text() == text


def test_successful_runs_are_consistent(results: tuple[dict[str, Any], Path]) -> None:
    data, _ = results
    for r in data["runs"]:
        assert r["status"] in ("ok", "gave_up", "error")
        if r["status"] != "ok":
            assert r["reason"], r
            continue
        assert r["samples_per_s"] > 0 and r["depth"] >= 1 and r["num_stages"] >= r["depth"]
        assert r["samples_per_s"] == pytest.approx(r["global_batch_size"] / r["iteration_time_s"])
        assert all(r["global_batch_size"] % b == 0 for b in r["micro_batch_sizes"])
        if "micro_batch" in r["options"]:
            assert r["micro_batch_sizes"] == [r["options"]["micro_batch"]]
        if r["planner"] in ("sequential", "pipedream", "piper"):
            assert r["depth"] == r["num_stages"], f"{r['planner']} returned a stage graph that is not a chain"


SEARCH_TOLERANCE = 1e-3  # graphpipe's TPS is the optimum's to this (docs/method.md §4)


def test_graphpipe_never_slower_than_best_sequential(results: tuple[dict[str, Any], Path]) -> None:
    """graphpipe ranks its candidates by simulation but searches chains only below its best graph pipeline's TPS
    (the search ends within SEARCH_TOLERANCE of an optimum), so a chain within that of its TPS may simulate a
    little faster: the benchmark lists every such case (`violations`); none may be slower by more."""
    data, _ = results
    assert data["failures"] == [], "graphpipe gave up or a planner crashed:\n" + "\n".join(
        f"{f['experiment']} {f['model']} {f['num_devices']} devices {f['options']}: {f['reason']}"
        for f in data["failures"])
    beyond = [v for v in data["violations"] if v["ratio"] < 1 - SEARCH_TOLERANCE]
    assert beyond == [], "graphpipe slower than a sequential plan:\n" + "\n".join(json.dumps(v) for v in beyond)
    for r in data["runs"]:
        if r["planner"] == "graphpipe" and r["status"] == "ok" and r["speedup"]:
            assert r["speedup"] >= 1 - SEARCH_TOLERANCE


def test_speedup_is_over_the_best_sequential_plan(bench: ModuleType) -> None:
    def run(planner: str, samples_per_s: float, **kw: Any) -> Any:
        return bench.Run(experiment="scaling", model="m", num_devices=4, global_batch_size=32, planner=planner,
                         samples_per_s=samples_per_s, **kw)

    runs = bench.with_speedups([run("graphpipe", 300.0), run("pipedream", 100.0), run("sequential", 200.0),
                                run("piper", 0.0, status="gave_up", reason="too many downsets")])
    by_planner = {r.planner: r for r in runs}
    assert by_planner["graphpipe"].speedup == pytest.approx(1.5)
    assert by_planner["pipedream"].speedup == pytest.approx(0.5)
    assert by_planner["piper"].speedup == 0.0
    assert bench.violations(runs) == []
    slow = bench.with_speedups([run("graphpipe", 150.0), run("sequential", 200.0)])
    assert [v["sequential_planner"] for v in bench.violations(slow)] == ["sequential"]


def test_plots_are_written(bench: ModuleType, results: tuple[dict[str, Any], Path]) -> None:
    data, out = results
    expected = {f"throughput_{m}.png" for m in bench.QUICK.models} | {
        "ratio_vs_mini_batch.png", "branch_sweep.png", "micro_batch_sweep.png", "ablation.png"}
    assert set(data["plots"]) == expected
    for name in expected:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replanning_the_stored_runs_moves_none(results: tuple[dict[str, Any], Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _, out = results
    replan = load_script("paper/replan.py", "paper_benchmark_replan")
    assert replan.main(["--results", str(out / "results.json")]) == 0
    assert " 0 moved" in capsys.readouterr().out


def test_search_ratio_times_every_configuration_graphpipe_planned(results: tuple[dict[str, Any], Path],
                                                                   tmp_path: Path) -> None:
    data, out = results
    ratio = load_script("paper/search_ratio.py", "paper_benchmark_search_ratio")
    assert ratio.main(["--results", str(out / "results.json"), "--rounds", "1", "--out", str(tmp_path / "r.json")]) == 0
    recorded = json.loads((tmp_path / "r.json").read_text())
    expected = ratio.configurations(data)
    assert len(recorded["entries"]) == len(expected) > 0
    for entry in recorded["entries"]:
        assert all(len(entry["seconds"][planner]) == 1 for planner in ratio.PLANNERS)
        assert entry["ratios"] == [entry["seconds"]["graphpipe"][0] / entry["seconds"]["sequential"][0]]
        (graph_s,), (ceiling_s,), (chain_s,) = (entry["searches"][part] for part in ratio.SEARCHES)
        assert graph_s > 0 and ceiling_s >= 0 and chain_s > 0
    assert recorded["summary"].startswith(f"{len(expected)} configurations")
    assert "the DP searches alone" in recorded["summary"]


def test_search_ratio_keeps_the_experiments_asked_for_at_the_granularity_asked_for(
        results: tuple[dict[str, Any], Path]) -> None:
    data, _ = results
    ratio = load_script("paper/search_ratio.py", "paper_benchmark_search_ratio")
    every = ratio.configurations(data)
    first = every[0]["experiment"]
    kept = ratio.configurations(data, first, "op")
    assert kept and all(run["experiment"] == first and run["granularity"] == "op" for run in kept)
    assert len(kept) <= sum(run["experiment"] == first for run in every)
    assert ratio.configurations(data, "no-such-experiment") == []
