"""The real-models benchmark on tiny CLIP and ALIGN towers: every planner recorded, pictures written.

`benchmarks/real_models/run.py --quick` captures Hugging Face models built from their config
classes on the meta device, costs them analytically and plans them with every planner; this test
runs it once into a temporary folder and checks the results file and the pictures.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.scripts import load_script

pytest.importorskip("transformers")

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("real_models/run.py", "real_models_benchmark_run")


@pytest.fixture(scope="module")
def results(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("real_models")
    bench.run_all(bench.QUICK, out)
    return json.loads((out / "results.json").read_text()), out


def test_every_model_device_count_and_planner_is_recorded(bench: ModuleType,
                                                         results: tuple[dict[str, Any], Path]) -> None:
    data, _ = results
    setup = bench.QUICK
    assert data["format"] == "graphpipe.real-models-benchmark/1"
    assert set(data["models"]) == {"clip", "align"}
    runs = data["runs"]
    assert len(runs) == 2 * len(setup.device_counts) * len(setup.batch_per_device) * len(setup.planners)
    for info in data["models"].values():
        assert info["built_on"] == "meta" and info["capture"] == "export"
        assert info["max_branches"] >= 2
    assert set(data["tables"]) == {"models", "throughput", "search"}


def test_runs_are_consistent(results: tuple[dict[str, Any], Path]) -> None:
    data, _ = results
    for r in data["runs"]:
        assert r["status"] in ("ok", "gave_up"), r
        if r["status"] != "ok":
            assert r["reason"] and r["planner"] != "graphpipe", r
            continue
        assert r["samples_per_s"] == pytest.approx(r["global_batch_size"] / r["iteration_time_s"])
        if r["planner"] != "graphpipe":
            assert r["depth"] == r["num_stages"], f"{r['planner']} returned a stage graph that is not a chain"


def test_pictures_are_written(bench: ModuleType, results: tuple[dict[str, Any], Path]) -> None:
    data, out = results
    n = bench.QUICK.picture_devices
    expected = {f"throughput_{m}.png" for m in ("clip", "align")} | {f"stages_{m}_{n}.png" for m in ("clip", "align")}
    assert set(data["plots"]) == expected
    for name in expected:
        assert (out / name).read_bytes()[:8] == PNG
    assert json.loads((out / f"plan_clip_{n}.json").read_text())["planner"] == "graphpipe"
