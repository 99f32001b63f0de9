"""The executor over the in-memory transport (ranks as threads) equals single-process training."""

from __future__ import annotations

import pytest
import torch

from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.schedule.generate import make_schedule
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import LR, SCENARIOS, compare, reference

NUM_STEPS = 3


def _train_in_threads(name: str, schedule: str, num_steps: int) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    scenario = SCENARIOS[name]
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    batches = scenario.make_batches(num_steps)
    sched = make_schedule(plan, schedule)
    # built here, not in the threads: the global RNG and fx tracing are not thread safe
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, schedule=sched, transport=hub.transport(rank), rank=rank,
                                example_inputs=batches[0][0])
                for rank in range(plan.world_size)]

    def body(rank: int) -> tuple[list[float], dict[str, torch.Tensor]]:
        trainer = trainers[rank]
        losses = [trainer.step(inputs, targets) for inputs, targets in batches]
        return losses, {k: v.detach().clone() for k, v in trainer.named_parameters()}

    results = run_threads(plan.world_size, body)
    params: dict[str, torch.Tensor] = {}
    for _, rank_params in results:
        params.update(rank_params)
    return [losses for losses, _ in results], params


@pytest.mark.parametrize(("name", "schedule"), [(n, k) for n in sorted(SCENARIOS) for k in SCENARIOS[n].schedules])
def test_in_memory_pipeline_equals_single_process_training(name: str, schedule: str) -> None:
    torch.set_num_threads(1)
    rank_losses, params = _train_in_threads(name, schedule, NUM_STEPS)
    expected_losses, expected_params = reference(SCENARIOS[name], NUM_STEPS)
    assert sorted(params) == sorted(expected_params)
    for losses in rank_losses:  # every rank reports the same mini-batch loss
        assert losses == rank_losses[0]
    problems = compare(rank_losses[0], params, expected_losses, expected_params)
    assert not problems, "\n".join(problems)


def test_the_same_seed_gives_the_same_losses_bit_for_bit() -> None:
    first, _ = _train_in_threads("branches4", "1f1b", 2)
    second, _ = _train_in_threads("branches4", "1f1b", 2)
    assert first == second


def test_an_edge_without_tensors_orders_its_stages_as_the_simulator_does() -> None:
    """A chain's link between two towers (stage 1 -> 2) carries no tensor; the towers still run in the
    chain's order: stage 2's forward of a micro-batch after stage 1's, stage 1's backward after stage 2's."""
    from dataclasses import replace

    from graphpipe.stages.stage_graph import StageEdge
    from tests.runtime.helpers import Branches, by_target, plan_from

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Branches(num_branches=2)
    plan = plan_from(model, by_target([("stem", 0), ("towers.0", 1), ("towers.1", 2), ("cat", 3)]),
                     [(0,), (1,), (2,), (3,)], micro_batch_size=2, global_batch_size=8)
    link = StageEdge(src=1, dst=2, tensors=(), bytes_per_sample=0.0)
    plan = replace(plan, edges=tuple(sorted((*plan.edges, link), key=lambda edge: (edge.src, edge.dst))))
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    x, y = torch.randn(8, 8), torch.randn(8, 3)
    trainers = [PipelineTrainer(Branches(num_branches=2), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
                                loss_fn=lambda out, target: (out - target).square().mean(),
                                schedule=make_schedule(plan, "1f1b"), transport=hub.transport(rank), rank=rank,
                                example_inputs=x)
                for rank in range(plan.world_size)]
    run_threads(plan.world_size, lambda rank: trainers[rank].step(x, y))
    spans = {(rank, event.action.kind.name, event.action.micro_batch): (event.start_s, event.end_s)
             for rank in (1, 2) for event in trainers[rank].executor.events}
    for micro_batch in range(4):
        assert spans[(2, "FORWARD", micro_batch)][0] >= spans[(1, "FORWARD", micro_batch)][1]
        assert spans[(1, "BACKWARD", micro_batch)][0] >= spans[(2, "BACKWARD", micro_batch)][1]
