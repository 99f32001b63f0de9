"""A stage's backward in two halves: the input gradients now (I), the weight gradients later (W).

Zero-bubble schedules (`graphpipe.schedule.zero_bubble`) send a predecessor the gradient it waits for as soon
as possible and compute the parameter gradients, which only the optimizer step needs, in the stage's bubbles.
The split is real, as in `torch.distributed.pipelining._backward` (`stage_backward_input`,
`stage_backward_weight`):

- `backward_input` walks the stage's autograd graph once and marks the nodes from which a received input is
  reached. Among them, the *frontier* nodes also lead, through a child that reaches no input, to parameters
  (a linear layer's matmul: its input path goes on, its weight path leaves). I runs autograd from the stage's
  outputs to its inputs only (`torch.autograd.grad`, graph kept), noting the gradient each frontier node
  receives, and adds the input gradients to the inputs' `.grad` (what the gradient sends read).
- `WeightGradWork.run` (the W) runs each frontier node again from its noted gradient, asking only for its
  children that lead to parameters alone (autograd then computes just those outputs: the matmul's weight
  product, not its input product), and finally one pass from those children, with the sums, into the
  parameters' `.grad` (`torch.autograd.backward(..., inputs=params)`: the post-accumulate hooks of the
  data-parallel buckets fire as in a whole backward). Outputs that reach no input (a source stage's) start
  that last pass directly.

Every node's work happens once: I and W together cost one backward (a node at the frontier runs in both, each
time computing only its own outputs). Two exceptions, both still exact. A parameter child that an input path
reaches too (a weight used directly in two nested ops of a stage: `(x * w) * w`): running its frontier node
again would count the inner path twice, so such a micro-batch runs its whole backward in I, and its W is
empty. A custom `torch.autograd.Function` at the frontier (the `sync` batch norm) computes every gradient its
`needs_input_grad` asks for, which the forward fixed, in each pass that runs it: its backward runs in I and
again in W.

A recomputing stage cannot split: under `torch.utils.checkpoint` each of the two passes runs the forward
again (the schedules and the validator keep it to whole backwards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["WeightGradWork", "backward_input"]

Edge = tuple[Node, int]  # a node and the input of it an edge enters (a `next_functions` entry)


@dataclass(slots=True)
class _Frontier:
    """A node where a parameter path leaves the input paths, with the gradient I gave it."""

    node: Node
    grads: tuple[torch.Tensor | None, ...] | None
    children: tuple[Edge, ...]  # its children that lead to parameters and no input


@dataclass(slots=True)
class WeightGradWork:
    """What W needs of a micro-batch after its I: the frontier nodes and their gradients, the outputs that
    reach no input, and the parameters. Holding it keeps the micro-batch's graph (and activations) alive."""

    frontier: list[_Frontier]
    roots: list[tuple[GradientEdge, torch.Tensor]]  # outputs that reach parameters and no input
    params: list[torch.Tensor]

    def run(self) -> None:
        """Add the parameters' gradients to their `.grad`; the graph is released afterwards."""
        starts: dict[tuple[int, int], tuple[GradientEdge, torch.Tensor]] = {}
        for edge, grad in self.roots:
            _add(starts, edge, grad)
        for front in self.frontier:
            if front.grads is None:
                continue
            outputs = [(GradientEdge(front.node, nr), g) for nr, g in enumerate(front.grads) if g is not None]
            if not outputs:
                continue
            children = [GradientEdge(node, nr) for node, nr in front.children]
            grads = torch.autograd.grad([edge for edge, _ in outputs], children, [g for _, g in outputs],
                                        retain_graph=True, allow_unused=True)
            for child, grad in zip(children, grads):
                if grad is not None:
                    _add(starts, child, grad)
        if starts and self.params:
            edges, grads = zip(*starts.values())
            torch.autograd.backward(list(edges), list(grads), inputs=self.params)
        self.frontier, self.roots, self.params = [], [], []


def _add(starts: dict[tuple[int, int], tuple[GradientEdge, torch.Tensor]], edge: GradientEdge,
         grad: torch.Tensor) -> None:
    key = (id(edge.node), edge.output_nr)
    if key in starts:
        starts[key] = (edge, starts[key][1] + grad)
    else:
        starts[key] = (edge, grad)


def backward_input(roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                   inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> WeightGradWork:
    """The I of a micro-batch: add to each of `inputs` (leaves that require gradients) its gradient from
    `roots` (the stage's outputs and loss) given their `grads` (None for a scalar loss); return the W."""
    root_grads = [torch.ones_like(root) if grad is None else grad for root, grad in zip(roots, grads)]
    graph = _Graph([_node_of(root) for root in roots], [_node_of(value) for value in inputs],
                   {_node_of(param): param for param in params if param.requires_grad})
    if graph.tangled():
        torch.autograd.backward(list(roots), root_grads)
        return WeightGradWork(frontier=[], roots=[], params=[])
    frontier = [_Frontier(node=node, grads=None, children=graph.param_children(node)) for node in graph.frontier()]
    handles = [front.node.register_prehook(_keep_into(front)) for front in frontier]
    try:
        if inputs:
            found = torch.autograd.grad(list(roots), list(inputs), root_grads, retain_graph=True, allow_unused=True)
            for value, grad in zip(inputs, found):
                if grad is not None:
                    value.grad = grad if value.grad is None else value.grad + grad
    finally:
        for handle in handles:
            handle.remove()
    weight_roots = [(get_gradient_edge(root), grad) for root, grad in zip(roots, root_grads)
                    if graph.weight_only(_node_of(root))]
    return WeightGradWork(frontier=frontier, roots=weight_roots, params=graph.reached_params())


def _keep_into(front: _Frontier) -> Any:
    def keep(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        front.grads = tuple(grad_outputs)

    return keep


def _node_of(tensor: torch.Tensor) -> Node:
    """The autograd node a tensor's gradient enters: its grad_fn, or a leaf's gradient accumulator."""
    if tensor.grad_fn is not None:
        return tensor.grad_fn
    return get_gradient_edge(tensor).node


class _Graph:
    """The nodes reachable from a micro-batch's roots, and which of them lead to an input or to a parameter."""

    def __init__(self, roots: list[Node], inputs: list[Node], params: dict[Node, torch.Tensor]) -> None:
        self.order = _post_order(roots)  # children before parents
        self.params = params
        self.children = {node: [(child, nr) for child, nr in node.next_functions if child is not None]
                         for node in self.order}
        self.to_input = self._leading_to(set(inputs))
        self.to_param = self._leading_to(set(params))

    def _leading_to(self, targets: set[Node]) -> set[Node]:
        found: set[Node] = set()
        for node in self.order:
            if node in targets or any(child in found for child, _ in self.children[node]):
                found.add(node)
        return found

    def weight_only(self, node: Node) -> bool:
        return node in self.to_param and node not in self.to_input

    def param_children(self, node: Node) -> tuple[Edge, ...]:
        """Its children that lead to parameters alone, each once (`addcmul(x, w, w)` reaches w twice: W asks for
        the gradient entering w, which sums both)."""
        return tuple(dict.fromkeys((child, nr) for child, nr in self.children[node] if self.weight_only(child)))

    def frontier(self) -> list[Node]:
        return [node for node in self.order if node in self.to_input and self.param_children(node)]

    def reached_params(self) -> list[torch.Tensor]:
        return [param for node, param in self.params.items() if node in self.to_param and node in self.children]

    def tangled(self) -> bool:
        """Whether some frontier node's parameter child is also reached through one of its input paths (the
        case that W cannot split without counting a path twice: the module docstring)."""
        parents: dict[Node, int] = {}
        for node in self.order:
            for child, _ in self.children[node]:
                parents[child] = parents.get(child, 0) + 1
        for node in self.frontier():
            shared = {child for child, _ in self.param_children(node) if parents.get(child, 0) > 1}
            if shared and self._reaches(node, shared):
                return True
        return False

    def _reaches(self, node: Node, targets: set[Node]) -> bool:
        """Whether a child of `node` on an input path reaches one of `targets`."""
        stack = [child for child, _ in self.children[node] if child in self.to_input]
        seen: set[Node] = set()
        while stack:
            current = stack.pop()
            if current in targets:
                return True
            if current not in seen:
                seen.add(current)
                stack.extend(child for child, _ in self.children.get(current, ()))
        return False


def _post_order(roots: list[Node]) -> list[Node]:
    """Every node reachable from `roots`, each after all of its children."""
    order: list[Node] = []
    done: set[Node] = set()
    for root in roots:
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in done:
                continue
            if expanded:
                done.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((child, False) for child, _ in node.next_functions if child is not None and child not in done)
    return order
