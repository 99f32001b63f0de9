"""The plan says once when batch statistics are taken over micro-batches instead of the mini-batch."""

from __future__ import annotations

import torch
from torch import nn

import graphpipe as gp
from graphpipe.planner.notes import batch_coupled_ops


def _bn_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def test_train_mode_batch_norm_is_found_with_either_capture() -> None:
    for method in ("fx", "export"):
        graph = gp.capture(_bn_model(), (torch.randn(8, 8),), capture=method)
        assert len(batch_coupled_ops(graph)) == 1, method
    graph = gp.capture(_bn_model().eval(), (torch.randn(8, 8),), capture="export")
    assert batch_coupled_ops(graph) == ()  # eval mode: running statistics, no coupling


def test_a_note_when_micro_batches_are_smaller_than_the_mini_batch() -> None:
    graph = gp.capture(_bn_model(), (torch.randn(8, 8),))
    costs = gp.analytic_costs(graph, device="v100-16gb")
    cluster = gp.Cluster.preset("summit", num_devices=2)
    split = gp.plan(graph, costs, cluster, 32, micro_batch_sizes=(8,))
    assert any("BatchNorm" in note and "8 samples" in note for note in split.notes)
    whole = gp.plan(graph, costs, gp.Cluster.preset("summit", num_devices=1), 32, micro_batch_sizes=(32,))
    assert not whole.notes
