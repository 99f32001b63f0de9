"""Training scenarios shared by the single-process executor tests and the multi-process tests."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch import nn

from graphpipe.model_inputs import as_model_inputs
from graphpipe.stages.stage_graph import Plan
from tests.runtime.helpers import Branches, Chain, TwoInputs, by_target, plan_from

LR = 1e-2
NOISE_FLOOR = LR * 1e-3
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_PLANS: dict[str, Plan] = {}


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    make_model: Callable[[], nn.Module]
    make_plan: Callable[[nn.Module], Plan]
    make_batches: Callable[[int], list[tuple[Any, torch.Tensor]]]
    schedules: tuple[str, ...] = ("1f1b", "gpipe")
    loss_fn: Callable[[Any, Any], torch.Tensor] = field(default=lambda out, target: mse(out, target))

    @property
    def world_size(self) -> int:
        return self.plan().world_size

    def plan(self) -> Plan:
        if self.name not in _PLANS:
            _PLANS[self.name] = self.make_plan(self.model())
        return _PLANS[self.name]

    def model(self) -> nn.Module:
        torch.manual_seed(1234)
        return self.make_model()


def _batches(batch: int, *, tokens: bool = False) -> Callable[[int], list[tuple[Any, torch.Tensor]]]:
    def make(num_steps: int) -> list[tuple[Any, torch.Tensor]]:
        gen = torch.Generator().manual_seed(99)
        out: list[tuple[Any, torch.Tensor]] = []
        for _ in range(num_steps):
            x = torch.randn(batch, 8, generator=gen)
            y = torch.randn(batch, 3, generator=gen)
            inputs: Any = (torch.randint(0, 11, (batch, 5), generator=gen), x) if tokens else x
            out.append((inputs, y))
        return out

    return make


def _zoo(name: str, batch: int) -> Any:
    from graphpipe.models import load_model

    return load_model(name, "tiny", batch_size=batch, seed=0)


def _zoo_batches(name: str, batch: int) -> Callable[[int], list[tuple[Any, Any]]]:
    def make(num_steps: int) -> list[tuple[Any, Any]]:
        from graphpipe.train import shuffled_batch

        zoo = _zoo(name, batch)
        return [shuffled_batch(zoo, 0, step) for step in range(num_steps)]

    return make


def _planned(name: str, planner: str, num_devices: int, batch: int, cluster_name: str = "local-cpu",
             device: str | None = None) -> Callable[[nn.Module], Plan]:
    """A plan from graphpipe's own planner (analytic costs of the cluster's device unless `device` is given)."""

    def make(model: nn.Module) -> Plan:
        from graphpipe.cost.analytic import analytic_costs
        from graphpipe.cost.cluster import Cluster
        from graphpipe.graph.capture import capture
        from graphpipe.planning import plan

        zoo = _zoo(name, batch)
        graph = capture(zoo.model, zoo.inputs)
        cluster = Cluster.preset(cluster_name, num_devices)
        return plan(graph, analytic_costs(graph, device or cluster.device), cluster, batch, planner=planner)

    return make


def _zoo_scenario(name: str, tag: str, make_plan: Callable[[nn.Module], Plan], batch: int) -> Scenario:
    loss = _zoo(name, 2).loss_fn
    return Scenario(name=tag, make_model=lambda: _zoo(name, batch).model, make_plan=make_plan,
                    make_batches=_zoo_batches(name, batch), loss_fn=loss)


def _clip_towers() -> Scenario:
    """A Hugging Face model (CLIP's two towers, captured with torch.export), planned by graphpipe on 4 V100s:
    the towers run side by side, 4 micro-batches of 2. In float64: attention's key bias has a zero gradient
    up to rounding, which Adam would scale up to a step of lr in float32, whatever the summation order."""
    spec = f"{EXAMPLES / 'clip_towers.py'}:factory"

    def zoo(batch: int) -> Any:
        from graphpipe.models import ZooModel, load_model

        found = load_model(spec, "tiny", batch_size=batch, seed=0, width=16, layers=2)
        inputs = {key: value.double() if value.is_floating_point() else value for key, value in found.inputs.items()}
        return ZooModel(found.model.double(), inputs, found.targets.double(), found.loss_fn)

    def make_plan(model: nn.Module) -> Plan:
        from graphpipe.cost.analytic import analytic_costs
        from graphpipe.cost.cluster import Cluster
        from graphpipe.graph.capture import capture
        from graphpipe.planning import plan

        example = zoo(8)
        graph = capture(example.model, example.inputs)
        cluster = Cluster.preset("summit", 4)
        return plan(graph, analytic_costs(graph, cluster.device), cluster, 8, micro_batch_sizes=(2,))

    def batches(num_steps: int) -> list[tuple[Any, Any]]:
        from graphpipe.train import shuffled_batch

        return [shuffled_batch(zoo(8), 0, step) for step in range(num_steps)]

    return Scenario(name="clip_towers4", make_model=lambda: zoo(8).model, make_plan=make_plan,
                    make_batches=batches, loss_fn=mse, schedules=("1f1b",))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target)


ZOO_SCENARIOS: tuple[Scenario, ...] = (
    _zoo_scenario("toy_diamond", "toy_diamond3", lambda m: plan_from(
        m, by_target([("stem", 0), ("left", 1), ("right", 2), ("add", 2)]), [(0,), (1,), (2,)],
        micro_batch_size=2, global_batch_size=8), 8),
    _zoo_scenario("toy_branches", "toy_branches4", lambda m: plan_from(
        m, by_target([("branches.0", 0), ("branches.1", 1), ("branches.2", 2), ("cat", 3)]),
        [(0,), (1,), (2,), (3,)], micro_batch_size=2, global_batch_size=8), 8),
    _zoo_scenario("mmt", "mmt_planned4", _planned("mmt", "graphpipe", 4, 8), 8),
    _zoo_scenario("transformer", "transformer_seq4", _planned("transformer", "sequential", 4, 8), 8),
    # three stages; the interaction index (a buffer read) rides with its reader in the last one
    _zoo_scenario("dlrm", "dlrm_planned3", _planned("dlrm", "graphpipe", 3, 8, "summit", "v100-16gb"), 8),
    _clip_towers(),
)

def _tied_batches(num_steps: int) -> list[tuple[Any, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    return [((torch.randint(0, 50, (8, 5), generator=gen), torch.randint(0, 50, (8, 7), generator=gen)),
             torch.randn(8, 50, generator=gen)) for _ in range(num_steps)]


def tied_stage(node: torch.fx.Node) -> int | None:
    """The embedding's two calls and the output layer tied to it on three different stages."""
    name = node.name
    if name in ("embed", "mean") or name.startswith("left_"):
        return 0
    if name in ("embed_1", "mean_1") or name.startswith("right_"):
        return 1
    return 2 if name in ("add", "t", "matmul") else None


def _inplace_cnn() -> nn.Module:
    from tests.corpus.models import InplaceCnn

    return InplaceCnn().double()


def _image_batches(num_steps: int) -> list[tuple[Any, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    return [(torch.randn(8, 3, 8, 8, generator=gen, dtype=torch.float64),
             torch.randn(8, 4, generator=gen, dtype=torch.float64)) for _ in range(num_steps)]


def inplace_entry_stage(node: torch.fx.Node) -> int | None:
    """Both in-place ReLUs of InplaceCnn (nn.ReLU(inplace=True), then torch.relu_) start a stage."""
    if node.name == "body_0":
        return 0
    return 2 if node.name in ("relu_", "mean", "head") else 1


def _tied_towers() -> nn.Module:
    from tests.corpus.models import TiedTowers

    return TiedTowers()


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    *ZOO_SCENARIOS,
    Scenario(name="chain2", make_model=Chain, make_batches=_batches(8),
             make_plan=lambda m: plan_from(m, by_target([("layers.0", 0), ("layers.2", 1)]), [(0,), (1,)],
                                           micro_batch_size=2, global_batch_size=8)),
    Scenario(name="diamond3", make_model=lambda: Branches(num_branches=2), make_batches=_batches(8),
             make_plan=lambda m: plan_from(m, by_target([("stem", 0), ("towers.0", 1), ("towers.1", 2), ("cat", 2)]),
                                           [(0,), (1,), (2,)], micro_batch_size=2, global_batch_size=8)),
    Scenario(name="branches4", make_model=Branches, make_batches=_batches(8),
             make_plan=lambda m: plan_from(m, by_target([("stem", 0), ("towers.0", 1), ("towers.1", 2),
                                                         ("towers.2", 3), ("cat", 3)]),
                                           [(0,), (1,), (2,), (3,)], micro_batch_size=4, global_batch_size=8)),
    Scenario(name="dp_stage3", make_model=Chain, make_batches=_batches(8),
             make_plan=lambda m: plan_from(m, by_target([("layers.0", 0), ("layers.2", 1)]), [(0, 1), (2,)],
                                           micro_batch_size=4, global_batch_size=8)),
    Scenario(name="dp_sink4", make_model=lambda: Branches(num_branches=2), make_batches=_batches(12),
             make_plan=lambda m: plan_from(m, by_target([("stem", 0), ("towers.0", 1), ("towers.1", 0),
                                                         ("cat", 2)]),
                                           [(0,), (1,), (2, 3)], micro_batch_size=6, global_batch_size=12)),
    Scenario(name="kfkb3", make_model=Chain, make_batches=_batches(8),
             make_plan=lambda m: plan_from(m, by_target([("layers.0", 0), ("layers.1", 1), ("layers.3", 2)]),
                                           [(0,), (1, 2), (3,)], micro_batch_size=(2, 4, 8), global_batch_size=8),
             schedules=("gpipe",)),
    Scenario(name="split3", make_model=lambda: Branches(num_branches=2), make_batches=_batches(8),
             make_plan=lambda m: plan_from(m, by_target([("stem", 0), ("towers.0", 1), ("towers.1", 2), ("cat", 2)]),
                                           [(0,), (1,), (2,)], micro_batch_size=(4, 2, 2), global_batch_size=8),
             schedules=("1f1b", "gpipe", "kfkb")),
    Scenario(name="inplace_cnn3", make_model=_inplace_cnn, make_batches=_image_batches,
             make_plan=lambda m: plan_from(m, inplace_entry_stage, [(0,), (1,), (2,)], micro_batch_size=2,
                                           global_batch_size=8)),
    Scenario(name="tied_towers3", make_model=_tied_towers, make_batches=_tied_batches,
             make_plan=lambda m: plan_from(m, tied_stage, [(0,), (1,), (2,)], micro_batch_size=2,
                                           global_batch_size=8)),
    Scenario(name="two_inputs3", make_model=TwoInputs, make_batches=_batches(6, tokens=True),
             make_plan=lambda m: plan_from(m, by_target([("emb", 0), ("a", 1), ("add", 2)]), [(0,), (1,), (2,)],
                                           micro_batch_size=3, global_batch_size=6)),
)}


def in_float64(value: Any) -> Any:
    """Floating-point tensors (in tuples) as float64; other values as they are."""
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(in_float64(item) for item in value)
    return value


def float64_scenario(scenario: Scenario) -> Scenario:
    """The scenario with its model and batches in float64, where a split run equals one device within 1e-10."""
    return dataclasses.replace(
        scenario, name=f"{scenario.name}_float64", make_model=lambda: scenario.make_model().double(),
        make_batches=lambda steps: [(in_float64(x), in_float64(y)) for x, y in scenario.make_batches(steps)])


def reference(scenario: Scenario, num_steps: int, *, clip: float | None = None, lr_scheduler: Any = None,
              norms: list[float] | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final parameters of single-process Adam training on the same batches (gradients clipped to
    the global norm `clip`, appending each step's norm to `norms`; the rate following `lr_scheduler(optimizer)`)."""
    model = scenario.model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = lr_scheduler(optimizer) if lr_scheduler is not None else None
    losses = []
    for inputs, targets in scenario.make_batches(num_steps):
        optimizer.zero_grad()
        given = as_model_inputs(inputs)
        loss = scenario.loss_fn(model(*given.args, **given.kwargs), targets)
        loss.backward()
        if clip is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            if norms is not None:
                norms.append(norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def compare(losses: list[float], params: dict[str, torch.Tensor], expected_losses: list[float],
            expected_params: dict[str, torch.Tensor], *, rtol: float = 1e-5) -> list[str]:
    """Human-readable mismatches (empty when the pipeline equals the reference).

    A parameter whose gradient is zero up to rounding (attention's key bias) moves by Adam steps of
    rounding noise only, a norm near 1e-11 after a few steps; such parameters are compared on the scale
    `NOISE_FLOOR` instead of their own norm."""
    problems = []
    for step, (got, want) in enumerate(zip(losses, expected_losses)):
        if abs(got - want) > rtol * max(abs(want), 1e-6):
            problems.append(f"loss at step {step}: {got!r} != {want!r}")
    for name, tensor in params.items():
        want_t = expected_params[name]
        rel = float((tensor.cpu() - want_t).norm() / want_t.norm().clamp_min(NOISE_FLOOR))
        if rel > rtol:
            problems.append(f"parameter {name}: relative error {rel:.3g}")
    return problems


def clone_model(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def in_memory_trainers(name: str, schedule: str = "1f1b") -> list[Any]:
    """One PipelineTrainer per rank of the scenario's plan, joined by an InMemoryHub (Adam, lr LR)."""
    from graphpipe.runtime.comm import InMemoryHub
    from graphpipe.runtime.trainer import PipelineTrainer

    scenario = SCENARIOS[name]
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    return [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                            loss_fn=scenario.loss_fn, schedule=schedule, transport=hub.transport(rank), rank=rank)
            for rank in range(plan.world_size)]
