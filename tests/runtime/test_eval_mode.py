"""Eval mode for graphs that baked the training mode into their ops (torch.export: `aten.dropout(..., True)`,
`aten.batch_norm(..., True, ...)`, the `num_batches_tracked` increment): inside `eval_mode` the graph computes
what `model.eval()` does and changes no buffer; after it, it trains as before. Through the trainer, an
export-captured model with dropout and BatchNorm evaluates as one device in eval mode."""

from __future__ import annotations

import copy

import torch
from torch import nn

from graphpipe.graph.capture import capture_module
from graphpipe.runtime.eval_mode import eval_mode


class DropNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.drop = nn.Dropout(0.5)
        self.norm = nn.BatchNorm1d(6)
        self.b = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.functional.dropout(self.norm(self.drop(self.a(x))), 0.2, training=self.training))


def _exported(model: nn.Module) -> torch.fx.GraphModule:
    return capture_module(model, (torch.randn(8, 4),), method="export", with_graph=False).module


def test_an_exported_graph_in_eval_mode_computes_what_model_eval_does_and_changes_no_buffer() -> None:
    torch.manual_seed(0)
    model = DropNorm()
    model.norm.running_mean.normal_()
    gm = _exported(model)
    x = torch.randn(8, 4)
    buffers = {name: value.clone() for name, value in gm.named_buffers()}
    with eval_mode(gm):
        first, second = gm(x), gm(x)
    reference = copy.deepcopy(model).eval()
    out = first[0] if isinstance(first, (tuple, list)) else first
    assert torch.equal(out, second[0] if isinstance(second, (tuple, list)) else second)
    assert torch.allclose(out, reference(x), atol=1e-6)
    assert all(torch.equal(value, buffers[name]) for name, value in gm.named_buffers())
    gm(x)  # training mode again: the batch statistics move the running ones and the counter
    assert int(dict(gm.named_buffers())["norm.num_batches_tracked"]) == 1
    assert gm.training


def test_an_export_captured_model_with_dropout_evaluates_through_the_trainer_as_one_device() -> None:
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.cost.cluster import Cluster
    from graphpipe.graph.capture import capture
    from graphpipe.planner.build import build_plan
    from graphpipe.planner.stage_cost import CostModel
    from graphpipe.planner.stage_spec import Partition, StageSpec
    from graphpipe.runtime.comm import InMemoryHub
    from graphpipe.runtime.trainer import PipelineTrainer
    from tests.runtime.helpers import run_threads

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DropNorm().double()
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    graph = capture(model, (x,), capture="export")
    cluster = Cluster.preset("local-cpu", 2)
    cut = graph.names.index(next(name for name in graph.names if name.startswith("dropout"))) + 1
    stages = (StageSpec(ops=tuple(graph.names[:cut]), num_devices=1, micro_batch_size=2),
              StageSpec(ops=tuple(graph.names[cut:]), num_devices=1, micro_batch_size=2))  # dropout | norm
    planned = build_plan(CostModel(graph, analytic_costs(graph, cluster.device), cluster, 8),
                         Partition(stages=stages, sequential=True), "manual")
    hub = InMemoryHub(planned.world_size, timeout_s=15)
    trainers = [PipelineTrainer(copy.deepcopy(model), planned, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                loss_fn=nn.functional.mse_loss, transport=hub.transport(rank), rank=rank,
                                example_inputs=(x,)) for rank in range(planned.world_size)]
    losses = run_threads(planned.world_size, lambda rank: trainers[rank].evaluate(x, y))
    with torch.no_grad():
        expected = float(nn.functional.mse_loss(copy.deepcopy(model).eval()(x), y))
    assert planned.capture == "export" and planned.num_stages == 2
    assert all(abs(loss - expected) <= 1e-12 * abs(expected) for loss in losses), (losses, expected)
