"""Checkpoint files checked against the sizes and sha256 their `complete` marker records (ranks as threads)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from graphpipe.errors import TrainingError
from graphpipe.runtime.checkpoint import COMPLETE, latest_complete, latest_intact, read_complete
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import SCENARIOS, in_memory_trainers

NAME = "dp_stage3"  # stage 0 on ranks 0-1, stage 1 on rank 2


def _trainers() -> list[PipelineTrainer]:
    return in_memory_trainers(NAME)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """step_1 and step_2 of one run, saved by every rank; each test works on a copy."""
    root = tmp_path_factory.mktemp("ckpt")
    trainers = _trainers()

    def body(rank: int) -> None:
        for step, (inputs, targets) in enumerate(SCENARIOS[NAME].make_batches(2), start=1):
            trainers[rank].step(inputs, targets)
            trainers[rank].save(str(root / f"step_{step}"))

    run_threads(len(trainers), body)
    return root


@pytest.fixture()
def ckpt(saved: Path, tmp_path: Path) -> Path:
    for step_dir in saved.iterdir():
        (tmp_path / step_dir.name).mkdir()
        for path in step_dir.iterdir():
            (tmp_path / step_dir.name / path.name).write_bytes(path.read_bytes())
    return tmp_path


def test_the_marker_records_the_size_and_sha256_of_every_file(ckpt: Path) -> None:
    files = read_complete(ckpt / "step_2")["files"]
    assert sorted(files) == ["rank_0_rng.pt", "rank_1_rng.pt", "rank_2_rng.pt", "stage_0.pt", "stage_1.pt"]
    for name, record in files.items():
        data = (ckpt / "step_2" / name).read_bytes()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert latest_intact(ckpt) == (ckpt / "step_2", [])


def test_a_truncated_stage_file_falls_back_to_the_newest_intact_step_on_every_rank(ckpt: Path) -> None:
    stage_file = ckpt / "step_2" / "stage_1.pt"
    size = stage_file.stat().st_size
    stage_file.write_bytes(stage_file.read_bytes()[:1234])
    assert latest_complete(ckpt) == ckpt / "step_2"  # complete, but damaged
    chosen, damaged = latest_intact(ckpt)
    assert chosen == ckpt / "step_1"
    assert damaged == [f"step_2 is damaged (stage_1.pt: 1234 of {size} bytes)"]
    trainers = _trainers()
    run_threads(len(trainers), lambda rank: trainers[rank].load(str(chosen)))
    assert [trainer.step_count for trainer in trainers] == [1, 1, 1]


def test_loading_a_damaged_step_names_the_file_instead_of_failing_in_torch_load(ckpt: Path) -> None:
    stage_file = ckpt / "step_2" / "stage_1.pt"
    stage_file.write_bytes(stage_file.read_bytes()[:100])
    rank_2 = _trainers()[2]  # the only rank that reads stage_1.pt
    with pytest.raises(TrainingError, match=r"step_2 is damaged \(stage_1.pt: 100 of \d+ bytes\); resume from an "
                                            "earlier step"):
        rank_2.load(str(ckpt / "step_2"))


def test_a_changed_byte_of_the_same_size_is_found_by_its_sha256(ckpt: Path) -> None:
    stage_file = ckpt / "step_2" / "stage_0.pt"
    data = bytearray(stage_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stage_file.write_bytes(bytes(data))
    chosen, damaged = latest_intact(ckpt)
    assert chosen == ckpt / "step_1"
    assert damaged == ["step_2 is damaged (stage_0.pt: the bytes changed since it was saved (sha256 differs))"]


def test_missing_files_and_an_unreadable_marker_count_as_damage(ckpt: Path) -> None:
    (ckpt / "step_2" / "rank_1_rng.pt").unlink()
    (ckpt / "step_1" / COMPLETE).write_text('{"step": 1, "num_st')
    chosen, damaged = latest_intact(ckpt)
    assert chosen is None
    assert damaged[0] == "step_2 is damaged (rank_1_rng.pt is missing)"
    assert damaged[1].startswith("step_1 is damaged (its complete marker is unreadable: checkpoint marker file ")


def test_a_marker_without_file_records_still_loads(ckpt: Path) -> None:
    marker = ckpt / "step_2" / COMPLETE
    old = {key: value for key, value in json.loads(marker.read_text()).items() if key != "files"}
    marker.write_text(json.dumps(old))
    assert latest_intact(ckpt) == (ckpt / "step_2", [])
    trainers = _trainers()
    run_threads(len(trainers), lambda rank: trainers[rank].load(str(ckpt / "step_2")))
    assert trainers[2].step_count == 2
