"""The reference runs `graphpipe calibrate` times use every rank, and the data-parallel one replicates it all."""

from __future__ import annotations

import pytest

from graphpipe.runtime.host_timing import _reference_plan

OPTIONS = {"num_branches": 2, "num_layers": 1, "hidden": 32, "ffn_hidden": 64, "seq_len": 8}


@pytest.mark.parametrize("size", [1, 4])
def test_the_reference_uses_every_rank_at_the_size_asked(size: int) -> None:
    _, reference = _reference_plan("mmt", "tiny", OPTIONS, 8, size, 2, data_parallel=False)
    assert sorted(rank for stage in reference.stages for rank in stage.ranks) == [0, 1]
    assert {stage.micro_batch_size // len(stage.ranks) for stage in reference.stages} <= {size, size // 2}


def test_the_data_parallel_reference_replicates_the_whole_model() -> None:
    _, replicated = _reference_plan("mmt", "tiny", OPTIONS, 8, 4, 2, data_parallel=True)
    (stage,) = replicated.stages
    assert stage.ranks == (0, 1) and replicated.num_devices == 2 and stage.micro_batch_size == 4
