"""`make gpu-check`'s driver: its stages fit the time budget, a stage that no longer fits is skipped and listed
(never failed), and the summary says where multi-rank NCCL was not tested."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "check.py"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def _context(check: Any, tmp_path: Path, *, cuda: bool, gpus: int, started_s_ago: float = 0.0) -> Any:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return check.Context(cuda=cuda, gpus=gpus, missing=frozenset(), out=tmp_path, start=time.time() - started_s_ago)


@pytest.mark.parametrize(("cuda", "gpus"), [(False, 0), (True, 1), (True, 4)], ids=["cpu", "one_gpu", "four_gpus"])
def test_the_stage_limits_add_up_within_the_budget(check: Any, tmp_path: Path, cuda: bool, gpus: int) -> None:
    stages = check.plan_stages(_context(check, tmp_path, cuda=cuda, gpus=gpus))
    assert check.planned_seconds(stages) <= check.BUDGET_S
    assert len({stage.name for stage in stages}) == len(stages)


def test_a_stage_that_no_longer_fits_is_skipped_and_listed(check: Any, tmp_path: Path) -> None:
    ctx = _context(check, tmp_path, cuda=False, gpus=0, started_s_ago=check.BUDGET_S - check.RESERVE_S - 30)
    ran: list[str] = []

    def run(ctx: Any, name: str, limit: float) -> Any:
        ran.append(name)
        return check.StageResult(name=name, status="pass", detail="ran")

    small, large = check.Stage("small", run, 20, ()), check.Stage("large", run, 60, ())
    results = [check.run_stage(ctx, stage, set()) for stage in (large, small)]
    assert ran == ["small"]
    assert [r.status for r in results] == ["skip", "pass"]
    assert "does not fit the time budget: its limit is 60 s" in results[0].detail
    env = {"mode": "cpu", "torch": "x", "cuda": None, "nccl": None, "python_version": "3", "python": "py",
           "gpus": [], "device_ranks": 2, "shared_ranks": 4, "install": "here", "missing_packages": []}
    text = check.write_summary(ctx, env, results, 0).read_text()
    assert "Skipped (not failed): large: does not fit the time budget" in text
    assert "multi-rank NCCL: not tested (CPU rehearsal" in text


def test_one_gpu_skips_multi_rank_nccl_and_says_so(check: Any, tmp_path: Path) -> None:
    ctx = _context(check, tmp_path, cuda=True, gpus=1)
    nccl = next(stage for stage in check.plan_stages(ctx) if stage.name == "nccl-pipeline")
    result = check.run_stage(ctx, nccl, set())
    assert result.status == "skip" and "multi-rank NCCL: not tested" in result.detail
    assert check.multi_rank_nccl(ctx, [result]).startswith("not tested (needs 2 GPUs")
