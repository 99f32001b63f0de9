"""T5 (Hugging Face, built from its config) trains like one device with its tied embedding split across stages:
the encoder's and the decoder's token embeddings are one parameter, held by every stage that reads it and summed
over them (fp64, Adam, 3 steps: 1e-10)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import graphpipe as gp
from graphpipe.graph.capture import capture_module
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.build import build_plan
from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.stage_spec import Partition, StageSpec
from graphpipe.stages.stage_graph import Plan
from graphpipe.stages.validate import check_runtime_rules, validate_plan
from tests.corpus.models import BATCH, CORPUS
from tests.corpus.training import train_both

pytest.importorskip("transformers")


def _loss(output: object, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output.last_hidden_state, targets)  # type: ignore[attr-defined]


def _decoder_embedding_moved_on(graph: OpGraph) -> Plan:
    """graphpipe's 2-stage plan with the decoder's token embedding (the second reader of the tied table, which
    the planner keeps in stage 0 next to the first) and everything it feeds in stage 0 moved to stage 1."""
    cluster = gp.Cluster.preset("summit", num_devices=2)
    costs = gp.analytic_costs(graph, device="v100-16gb")
    planned = gp.plan(graph, costs, cluster, global_batch_size=BATCH)
    readers = [op.name for op in graph.ops for param in op.params
               for name in (op.name, *param.shared_with) if param.name == "shared.weight"]
    first = set(planned.stages[0].ops)
    moved = {name for name in _fed_by(graph, readers[-1]) if name in first}
    stages = (StageSpec(ops=tuple(op for op in planned.stages[0].ops if op not in moved), num_devices=1,
                        micro_batch_size=2),
              StageSpec(ops=tuple(op for op in planned.stages[0].ops if op in moved) + planned.stages[1].ops,
                        num_devices=1, micro_batch_size=2))
    built = build_plan(CostModel(graph, costs, cluster, BATCH), Partition(stages=stages), planner="manual")
    return dataclasses.replace(built, capture=planned.capture, replicated=planned.replicated,
                               input_batch_axes=planned.input_batch_axes)


def _fed_by(graph: OpGraph, start: str) -> set[str]:
    """`start` and every op that reads it, transitively."""
    found, stack = set(), [start]
    while stack:
        name = stack.pop()
        if name not in found:
            found.add(name)
            stack.extend(graph.successors(name))
    return found


def test_t5_with_its_tied_embedding_on_several_stages_trains_like_one_device() -> None:
    torch.manual_seed(0)
    model, inputs, _ = next(entry for entry in CORPUS if entry.name == "t5").build()
    model = model.double()
    graph = capture_module(model, inputs).graph
    assert graph is not None
    plan = _decoder_embedding_moved_on(graph)
    shared = plan.shared_params.get("shared.weight")
    assert shared is not None and shared["stages"] == [0, 1], plan.shared_params  # split across stages
    validate_plan(plan, graph)
    check_runtime_rules(plan, graph)

    gen = torch.Generator().manual_seed(1)
    batches = [(inputs, torch.randn(BATCH, 6, 32, generator=gen, dtype=torch.float64)) for _ in range(3)]
    losses, expected, worst = train_both(model, plan, batches, _loss)
    assert losses == pytest.approx(expected, rel=1e-10)
    assert worst < 1e-10
