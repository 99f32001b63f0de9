"""Small models, hand-made plans and a single-process reference for the runtime tests."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn

from graphpipe.graph.tracer import trace_module
from graphpipe.stages.stage_graph import Plan, Stage, StageEdge


class Chain(nn.Module):
    def __init__(self, width: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


class Branches(nn.Module):
    """`num_branches` towers of two layers on a shared stem, concatenated into a head (fan-out, fan-in)."""

    def __init__(self, width: int = 8, num_branches: int = 3) -> None:
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width)) for _ in range(num_branches))
        self.head = nn.Linear(width * num_branches, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return self.head(torch.cat([tower(h) for tower in self.towers], dim=1))


class TwoInputs(nn.Module):
    """Two model inputs read by different stages, an integer input crossing nowhere, a skip connection."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, width)
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.out = nn.Linear(width, 3)

    def forward(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens).mean(dim=1) + torch.sin(self.a(x))
        return self.out(torch.tanh(self.b(h)) + h)


def plan_from(model: nn.Module, assign: Callable[[torch.fx.Node], int | None], ranks: Sequence[Sequence[int]], *,
              micro_batch_size: int | Sequence[int], global_batch_size: int) -> Plan:
    """A plan whose stage of each fx node is `assign(node)`; placeholders join their first reader.

    Nodes `assign` leaves open (None) join the latest stage among their inputs (the output: the last stage).
    """
    gm = trace_module(model)
    num_stages = len(ranks)
    sizes = [micro_batch_size] * num_stages if isinstance(micro_batch_size, int) else list(micro_batch_size)
    stage_of: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            stage_of[node.name] = num_stages - 1
        elif node.op not in ("placeholder", "get_attr"):
            chosen = assign(node)
            inherited = max((stage_of.get(src.name, 0) for src in node.all_input_nodes), default=0)
            stage_of[node.name] = inherited if chosen is None else chosen
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            stage_of[node.name] = min(stage_of[user.name] for user in node.users)
    edges: dict[tuple[int, int], list[str]] = {}
    for node in gm.graph.nodes:
        for src in node.all_input_nodes:
            if stage_of[src.name] != stage_of[node.name]:
                edges.setdefault((stage_of[src.name], stage_of[node.name]), []).append(src.name)
    stages = tuple(
        Stage(idx=idx, ops=tuple(n.name for n in gm.graph.nodes if stage_of[n.name] == idx), ranks=tuple(ranks[idx]),
              micro_batch_size=sizes[idx], in_flight_samples=sizes[idx])
        for idx in range(num_stages))
    return Plan(graph_name=type(model).__name__, stages=stages,
                edges=tuple(StageEdge(src=s, dst=d, tensors=tuple(dict.fromkeys(t)), bytes_per_sample=4.0)
                            for (s, d), t in sorted(edges.items())),
                global_batch_size=global_batch_size, num_devices=sum(len(r) for r in ranks), planner="manual")


def by_target(rules: Sequence[tuple[str, int]]) -> Callable[[torch.fx.Node], int | None]:
    """Stage of a node: the first rule whose prefix starts the node's target (call_module) or name."""

    def assign(node: torch.fx.Node) -> int | None:
        key = str(node.target) if node.op == "call_module" else node.name
        return next((stage for prefix, stage in rules if key.startswith(prefix)), None)

    return assign


def reference_training(model: nn.Module, batches: Sequence[tuple[Any, torch.Tensor]],
                       loss_fn: Callable[..., torch.Tensor], lr: float = 1e-2) -> tuple[list[float], nn.Module]:
    """Plain single-process Adam training on whole mini-batches: the numbers the pipeline must match."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        loss = loss_fn(model(*args), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def run_threads(world_size: int, body: Callable[[int], Any]) -> list[Any]:
    """Run `body(rank)` on `world_size` threads; re-raise the first failure."""
    results: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=target, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def max_relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-12))
