"""Multi-process training on gloo equals single-process training: losses and every parameter, by name.

One process group per world size runs every scenario of that size under both schedules,
plus a save/load round trip and the wrong-world-size refusal.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.dist import tasks
from tests.dist.harness import run_world
from tests.runtime.scenarios import SCENARIOS, compare, reference

pytestmark = pytest.mark.dist
NUM_STEPS = 3


def _check_training(results: dict[str, list[Any]], name: str, schedule: str) -> None:
    per_rank = results[f"{name}/{schedule}"]
    losses = per_rank[0]["losses"]
    assert all(r["losses"] == losses for r in per_rank), "ranks report different losses"
    params = {k: torch.from_numpy(np.asarray(v)) for r in per_rank for k, v in r["params"].items()}
    expected_losses, expected_params = reference(SCENARIOS[name], NUM_STEPS)
    assert sorted(params) == sorted(expected_params), "every parameter lives on exactly one stage"
    problems = compare(losses, params, expected_losses, expected_params)
    assert not problems, f"{name} {schedule}:\n" + "\n".join(problems)


IDLE_SCENARIO = "diamond3"  # a 3-rank plan, trained in the 4-rank world: rank 3 idles


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_pipeline_training_equals_single_process(world_size: int, tmp_path: Any) -> None:
    names = sorted(n for n, s in SCENARIOS.items() if s.world_size == world_size)
    jobs: list[Any] = [(f"{n}/{k}", tasks.train, (n, k, NUM_STEPS)) for n in names for k in SCENARIOS[n].schedules]
    bigger = [n for n, s in SCENARIOS.items() if s.world_size > world_size]
    if bigger:
        jobs.append(("wrong_world", tasks.wrong_world_size, (bigger[0],)))
    if world_size == 4:
        jobs.append(("idle", tasks.train, (IDLE_SCENARIO, "1f1b", NUM_STEPS)))
    results = run_world(world_size, jobs)
    for name in names:
        for schedule in SCENARIOS[name].schedules:
            _check_training(results, name, schedule)
    if bigger:
        message = results["wrong_world"][0]
        assert f"made for {SCENARIOS[bigger[0]].world_size} ranks" in message and f"has {world_size}" in message
    if world_size == 4:
        _check_idle_rank(results["idle"])


def _check_idle_rank(per_rank: list[Any]) -> None:
    """Ranks 0-2 train the 3-rank plan exactly; rank 3 takes no stage: nan losses, no parameters."""
    working, idle = per_rank[:3], per_rank[3]
    assert all(np.isnan(loss) for loss in idle["losses"]) and not idle["params"]
    params = {k: torch.from_numpy(np.asarray(v)) for r in working for k, v in r["params"].items()}
    expected_losses, expected_params = reference(SCENARIOS[IDLE_SCENARIO], NUM_STEPS)
    assert all(r["losses"] == working[0]["losses"] for r in working)
    assert sorted(params) == sorted(expected_params)
    problems = compare(working[0]["losses"], params, expected_losses, expected_params)
    assert not problems, "\n".join(problems)


def test_resume_in_new_processes_equals_uninterrupted(tmp_path: Any) -> None:
    name = "diamond3"
    directory = str(tmp_path / "step_2")
    first = run_world(3, [("save", tasks.train_and_save, (name, directory, 2))])["save"][0]
    second = run_world(3, [("load", tasks.load_and_train, (name, directory, 2, 2))])["load"][0]
    expected, _ = reference(SCENARIOS[name], 4)
    np.testing.assert_allclose(first + second, expected, rtol=1e-5)
