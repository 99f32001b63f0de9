"""DLRM of the paper (§6): dense feed-forward branches and sparse embedding-bag branches, interaction, top MLP.

Each dense branch maps its own dense features through `num_layers` Linear+ReLU layers down to
`embedding_dim`; each sparse branch sums `bag_size` rows of its own table. The interaction takes the
pairwise dot products of all branch vectors (upper triangle), concatenated with the dense vectors,
as in the DLRM reference model; the top MLP gives one logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.models.layers import mlp
from graphpipe.models.zoo_model import ExampleData, ZooModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    num_branches: int = 7  # dense branches
    num_sparse_branches: int = 7
    num_layers: int = 4
    dense_in_features: int = 1024
    hidden: int = 4096
    embedding_dim: int = 64
    num_embeddings: int = 1_000_000
    bag_size: int = 100
    num_top_layers: int = 3
    top_hidden: int = 4096
    batch_size: int = 8


PRESETS: dict[str, Config] = {
    "tiny": Config(dense_in_features=16, hidden=32, embedding_dim=8, num_embeddings=100, bag_size=4, top_hidden=32,
                   batch_size=4),
    "paper": Config(),
}


class PairwiseInteraction(nn.Module):
    """Dot products of every pair of feature vectors (strict upper triangle), beside the dense vectors."""

    pair_idx: torch.Tensor

    def __init__(self, num_features: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_features, num_features, offset=1)
        self.register_buffer("pair_idx", rows * num_features + cols, persistent=False)
        self.num_pairs = num_features * (num_features - 1) // 2

    def forward(self, dense: list[torch.Tensor], sparse: list[torch.Tensor]) -> torch.Tensor:
        vectors = torch.stack(dense + sparse, dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)
        return torch.cat([*dense, dots[:, self.pair_idx]], dim=1)


class DLRM(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.dense = nn.ModuleList(mlp(config.dense_in_features, config.hidden, config.num_layers,
                                       out_features=config.embedding_dim) for _ in range(config.num_branches))
        self.sparse = nn.ModuleList(nn.EmbeddingBag(config.num_embeddings, config.embedding_dim, mode="sum")
                                    for _ in range(config.num_sparse_branches))
        num_features = config.num_branches + config.num_sparse_branches
        self.interaction = PairwiseInteraction(num_features)
        top_in = config.num_branches * config.embedding_dim + self.interaction.num_pairs
        self.top = mlp(top_in, config.top_hidden, config.num_top_layers, out_features=1, last_relu=False)
        self.num_inputs = config.num_branches + config.num_sparse_branches  # placeholders of forward(*inputs)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        num_dense = len(self.dense)
        dense = [branch(x) for branch, x in zip(self.dense, inputs[:num_dense])]
        sparse = [table(idx) for table, idx in zip(self.sparse, inputs[num_dense:])]
        out: torch.Tensor = self.top(self.interaction(dense, sparse))
        return out


def build(config: Config, data: ExampleData) -> ZooModel:
    model = DLRM(config)
    dense = tuple(data.randn(config.batch_size, config.dense_in_features) for _ in range(config.num_branches))
    sparse = tuple(data.randint(config.num_embeddings, config.batch_size, config.bag_size)
                   for _ in range(config.num_sparse_branches))
    return ZooModel(model, dense + sparse, data.bernoulli(config.batch_size, 1), nn.BCEWithLogitsLoss())
