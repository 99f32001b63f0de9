"""The measured profiler on CPU: every op costed, sizes as asked, model left untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.profile import batch_of, profile
from graphpipe.errors import CostError
from graphpipe.graph.capture import capture

SIZES = (1, 3, 8)


class Net(nn.Module):
    """Two branches, a tuple-returning attention, an in-place ReLU, an op on a parameter, an integer op."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(6, 8)
        self.act = nn.ReLU(inplace=True)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.right = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(16)
        self.scale = nn.Parameter(torch.ones(16))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        left = self.act(self.left(x)).unsqueeze(1)
        mixed, _ = self.attn(left, left, left)
        hidden = torch.cat([mixed.squeeze(1), torch.tanh(self.right(x))], dim=1)
        hidden = self.norm(hidden) * self.scale
        shift = (ids % 2).float().unsqueeze(1)  # no gradient flows through here
        return self.head(hidden) + shift


@pytest.fixture(scope="module")
def measured() -> tuple[torch.fx.GraphModule, CostTable, Net]:
    torch.manual_seed(0)
    model = Net()
    inputs = (torch.randn(4, 6), torch.randint(0, 10, (4,)))
    graph = capture(model, inputs)
    table = profile(graph, model, SIZES, example_inputs=inputs, warmup=1, repeats=2, progress=False, num_threads=1)
    return graph, table, model


def test_every_op_at_every_size(measured) -> None:
    graph, table, _ = measured
    assert table.source == "measured" and table.device == "cpu"
    assert table.op_names == graph.names
    assert table.micro_batch_sizes == SIZES
    assert all(set(per) == set(SIZES) for per in table.entries.values())


def test_compute_ops_take_time_and_inputs_do_not(measured) -> None:
    graph, table, _ = measured
    for op in graph.ops:
        for size in SIZES:
            cost = table.at(op.name, size)
            if op.module_type in ("Linear", "MultiheadAttention", "LayerNorm", "cat", "tanh", "mul"):
                assert cost.fwd_ms > 0, (op.name, size)
            if op.kind in ("placeholder", "output", "get_attr"):
                assert cost.fwd_ms == cost.bwd_ms == 0.0
    assert all(table.at(name, size).bwd_ms == 0.0 for name in graph.names
               if graph.op(name).module_type in ("remainder", "mod") for size in SIZES)


def test_sizes_follow_the_micro_batch(measured) -> None:
    graph, table, model = measured
    head = next(op.name for op in graph.ops if op.module_type == "Linear" and op.module_path == "head")
    for size in SIZES:
        cost = table.at(head, size)
        assert cost.output_bytes == size * 3 * 4
        assert cost.act_bytes >= size * 16 * 4  # a Linear keeps (at least) its input
        assert cost.param_bytes == sum(p.numel() * 4 for p in model.head.parameters())
    attn = next(op.name for op in graph.ops if op.module_type == "MultiheadAttention")
    assert table.at(attn, 8).output_bytes > table.at(attn, 1).output_bytes > 0  # tuple output counted
    assert table.at(attn, 8).act_bytes > table.at(attn, 1).act_bytes > 0


def test_the_model_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)).eval()
    inputs = (torch.randn(6, 4),)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    rng = torch.get_rng_state()
    graph = capture(model, inputs)
    profile(graph, model, [2, 6], example_inputs=inputs, warmup=0, repeats=1, progress=False)
    assert not model.training
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert all(param.grad is None for param in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_inputs_are_made_from_the_graph_when_not_given() -> None:
    model = nn.ModuleDict({"emb": nn.EmbeddingBag(5, 4), "fc": nn.Linear(4, 2)})

    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.layers["fc"](self.layers["emb"](ids))

    net = Bag()
    graph = capture(net, (torch.randint(0, 5, (3, 7)),))
    table = profile(graph, net, [2, 4], warmup=0, repeats=1, progress=False)
    assert table.at("layers_emb", 4).output_bytes == 4 * 4 * 4 and table.at("layers_fc", 2).fwd_ms > 0


def test_round_trip(measured, tmp_path) -> None:
    _, table, _ = measured
    path = str(tmp_path / "measured.json")
    table.save(path)
    assert CostTable.load(path).entries == table.entries
    assert CostTable.load(path).spread == table.spread is not None and table.spread >= 0


def test_the_spread_is_the_summed_interquartile_range_over_the_summed_medians() -> None:
    from graphpipe.cost.profile import Spread

    spread = Spread()
    spread.add([1.0, 1.0, 1.0, 1.0, 1.0])  # quiet: no spread
    spread.add([2.0, 2.0, 3.0, 4.0, 4.0])  # quartiles 2 and 4 around a median of 3
    assert spread.relative() == pytest.approx(2.0 / 4.0)
    spread.clear()
    assert spread.relative() == 0.0


def test_the_ops_sum_to_the_whole_pass_each_size_and_pass_apart(monkeypatch) -> None:
    """Scaled to the whole model's pass (here a made-up one) the ops keep their shares; without it their sums
    are the ops' own."""
    from graphpipe.cost.profile import OpTimer

    torch.manual_seed(0)
    model, inputs = Net(), (torch.randn(4, 6), torch.randint(0, 10, (4,)))
    graph = capture(model, inputs)
    whole = {1: (2.0, 5.0), 3: (3.0, 7.0)}
    monkeypatch.setattr(OpTimer, "whole_pass_ms", lambda self, gm, batch: whole[batch[0].shape[0]])
    scaled = profile(graph, model, (1, 3), example_inputs=inputs, warmup=0, repeats=1, progress=False)
    alone = profile(graph, model, (1, 3), example_inputs=inputs, warmup=0, repeats=1, progress=False,
                    whole_pass=False)
    for size, (fwd, bwd) in whole.items():
        costs = [scaled.at(op, size) for op in scaled.entries]
        assert sum(c.fwd_ms for c in costs) == pytest.approx(fwd)
        assert sum(c.bwd_ms for c in costs) == pytest.approx(bwd)
        assert sum(alone.at(op, size).fwd_ms for op in alone.entries) != pytest.approx(fwd)
        assert [c.act_bytes for c in costs] == [alone.at(op, size).act_bytes for op in alone.entries]


def test_a_whole_pass_out_of_memory_keeps_the_ops_own_times(monkeypatch) -> None:
    """One op at a time fits where the whole pass may not (a large micro-batch on a GPU): the whole pass then
    reports nothing and that size keeps the ops' times alone instead of failing the profile."""
    from graphpipe.cost.profile import OpTimer

    def out_of_memory(self, outs, leaves):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    torch.manual_seed(0)
    model, inputs = Net(), (torch.randn(4, 6), torch.randint(0, 10, (4,)))
    timer = OpTimer(torch.device("cpu"), warmup=0, repeats=1, skip_storages=frozenset())
    monkeypatch.setattr(OpTimer, "_grad_ms", out_of_memory)
    assert timer.whole_pass_ms(torch.fx.symbolic_trace(model), inputs) is None
    monkeypatch.undo()
    monkeypatch.setattr(OpTimer, "whole_pass_ms", lambda self, gm, batch: None)
    table = profile(capture(model, inputs), model, (2,), example_inputs=inputs, warmup=0, repeats=1, progress=False)
    assert sum(table.at(op, 2).fwd_ms for op in table.entries) > 0


def test_the_whole_pass_is_timed_as_a_stage_runs_it(measured) -> None:
    """The real whole pass: positive, and the model's gradients are left as they were (`autograd.grad`)."""
    from graphpipe.cost.profile import OpTimer

    _, _, model = measured
    traced = torch.fx.symbolic_trace(model)
    fwd_ms, bwd_ms = OpTimer(torch.device("cpu"), warmup=1, repeats=2, skip_storages=frozenset()).whole_pass_ms(
        traced, (torch.randn(3, 6), torch.randint(0, 10, (3,))))
    assert fwd_ms > 0 and bwd_ms > 0
    assert all(p.grad is None for p in model.parameters())


def test_batch_of_slices_and_repeats() -> None:
    x, ids = torch.arange(12.0).reshape(4, 3), torch.arange(4)
    small = batch_of((x, ids, 7), 2, torch.device("cpu"))
    assert torch.equal(small[0], x[:2]) and torch.equal(small[1], ids[:2]) and small[2] == 7
    big = batch_of((x, ids), 6, torch.device("cpu"))
    assert big[0].shape == (6, 3) and torch.equal(big[0][4:], x[:2])


def test_bad_requests_raise_cost_errors() -> None:
    model = nn.Linear(3, 2)
    inputs = (torch.randn(2, 3),)
    graph = capture(model, inputs)
    with pytest.raises(CostError, match="positive"):
        profile(graph, model, [0], example_inputs=inputs, progress=False)
    with pytest.raises(CostError, match="repeats"):
        profile(graph, model, [1], example_inputs=inputs, repeats=0, progress=False)
    with pytest.raises(CostError, match="meta"):
        profile(graph, nn.Linear(3, 2, device="meta"), [1], example_inputs=inputs, progress=False)
    other = capture(nn.Sequential(nn.Linear(3, 2), nn.ReLU()), inputs)
    with pytest.raises(CostError, match="not in the traced model"):
        profile(other, model, [1], example_inputs=inputs, progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(CostError, match="CUDA"):
            profile(graph, model, [1], example_inputs=inputs, device="cuda", progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profiles_on_cuda_without_moving_the_callers_model() -> None:
    torch.manual_seed(0)
    model = Net()
    inputs = (torch.randn(4, 6), torch.randint(0, 10, (4,)))
    graph = capture(model, inputs)
    table = profile(graph, model, [2, 4], example_inputs=inputs, device="cuda", warmup=1, repeats=2, progress=False)
    assert table.op_names == graph.names and table.device != "cpu"
    assert table.at("head", 4).fwd_ms > 0 and table.at("head", 4).output_bytes == 4 * 3 * 4
    assert all(param.device.type == "cpu" for param in model.parameters())
