"""`--weights DIR` reads a distributed checkpoint without running code from it, and still reads real ones right."""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemReader

from graphpipe.errors import TrainingError, WeightsError
from graphpipe.runtime.weights_file import WeightsFile


class _OpensMarker:
    """Unpickling it creates `path` (through `open`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


class _RunsShell:
    """Unpickling it runs `touch path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path), no_dist=True)


def _state() -> dict[str, torch.Tensor]:
    return {"embed.weight": torch.arange(12.0).reshape(3, 4), "head.bias": torch.tensor([1.5, -2.0]),
            "scale": torch.tensor(3.0, dtype=torch.bfloat16), "steps": torch.tensor([7, 8, 9])}


@pytest.mark.parametrize("payload", [_OpensMarker, _RunsShell])
def test_crafted_metadata_is_refused_without_running(payload: type, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / ".metadata").write_bytes(pickle.dumps(payload(marker)))
    with pytest.raises(TrainingError, match=r"\.metadata refused: unpickling it would build .*could run code.*"
                                            r"dcp_to_torch_save.*\.safetensors") as caught:
        WeightsFile(checkpoint)
    assert not marker.exists()
    assert "\n" not in str(caught.value)


def test_metadata_payload_nested_inside_real_metadata_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    _save(_state(), tmp_path / "ckpt")
    with open(tmp_path / "ckpt" / ".metadata", "rb") as handle:
        metadata = pickle.load(handle)  # the test's own, trusted file
    metadata.storage_meta.modules = [_OpensMarker(marker)]
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(TrainingError, match="refused"):
        WeightsFile(tmp_path / "ckpt")
    assert not marker.exists()


def test_state_set_on_a_class_is_refused(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import Metadata

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    # GLOBAL Metadata; BUILD (None, {"graphpipe_probe": 1}): would setattr on the class itself.
    crafted = (b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\nN}X\x0f\x00\x00\x00graphpipe_probe"
               b"K\x01s\x86b.")
    (checkpoint / ".metadata").write_bytes(crafted)
    with pytest.raises(TrainingError, match="refused: unpickling it would build state on a"):
        WeightsFile(checkpoint)
    assert not hasattr(Metadata, "graphpipe_probe")


def test_crafted_tensor_blob_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    _save(_state(), tmp_path / "ckpt")
    blob = io.BytesIO()
    torch.save(_OpensMarker(marker), blob)
    (tmp_path / "ckpt" / "evil.distcp").write_bytes(blob.getvalue())
    _repoint(tmp_path / "ckpt", "head.bias", "evil.distcp", len(blob.getvalue()))
    source = WeightsFile(tmp_path / "ckpt")
    with pytest.raises(TrainingError, match=r"evil.distcp: the blob of 'head.bias' is not a plain tensor"):
        source.read({"head.bias": (torch.Size([2]), torch.float32)})
    assert not marker.exists()


def test_storage_outside_the_directory_is_refused(tmp_path: Path) -> None:
    _save(_state(), tmp_path / "ckpt")
    _repoint(tmp_path / "ckpt", "head.bias", "../outside.distcp", 10)
    with pytest.raises(TrainingError, match=r"points at '../outside.distcp', outside the checkpoint directory"):
        WeightsFile(tmp_path / "ckpt")


def _repoint(checkpoint: Path, key: str, relative: str, length: int) -> None:
    """Rewrite the (trusted, test-made) metadata so `key`'s blob is `relative`[0:length]."""
    with open(checkpoint / ".metadata", "rb") as handle:
        metadata = pickle.load(handle)
    for index, info in metadata.storage_data.items():
        if index.fqn == key:
            info.relative_path, info.offset, info.length = relative, 0, length
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))


def test_real_checkpoint_reads_a_subset_without_dcp_unpickling(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state()
    _save(state, tmp_path / "ckpt")

    def unsafe(*_: object, **__: object) -> None:
        raise AssertionError("FileSystemReader.read_metadata unpickles without restriction")

    monkeypatch.setattr(FileSystemReader, "read_metadata", unsafe)
    source = WeightsFile(tmp_path / "ckpt")
    assert source.shapes == {"embed.weight": (3, 4), "head.bias": (2,), "scale": (), "steps": (3,)}
    read = source.read({"embed.weight": (torch.Size([3, 4]), torch.float64), "scale": (torch.Size([]), torch.float32),
                        "steps": (torch.Size([3]), torch.int64)})
    assert set(read) == {"embed.weight", "scale", "steps"}
    assert torch.equal(read["embed.weight"], state["embed.weight"].double())
    assert read["embed.weight"].dtype == torch.float64
    assert read["scale"].item() == 3.0 and torch.equal(read["steps"], state["steps"])


def test_truncated_blob_file_says_so(tmp_path: Path) -> None:
    _save(_state(), tmp_path / "ckpt")
    (data,) = tmp_path.joinpath("ckpt").glob("*.distcp")
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(TrainingError, match=r"the file ends first; the checkpoint is truncated"):
        WeightsFile(tmp_path / "ckpt").read({"steps": (torch.Size([3]), torch.int64)})


@pytest.mark.parametrize("kind", ["safetensors", "dcp"])
def test_integers_for_a_float_parameter_are_refused_not_cast(kind: str, tmp_path: Path) -> None:
    """A rank would otherwise train from int32 weights cast to float without a word; floats of another width
    (a bf16 file for a float32 model) still convert."""
    from safetensors.torch import save_file

    state = {"w": torch.ones(2, 2, dtype=torch.int32), "b": torch.ones(2, dtype=torch.bfloat16)}
    path = tmp_path / ("w.safetensors" if kind == "safetensors" else "ckpt")
    if kind == "safetensors":
        save_file(state, path)
    else:
        _save(state, path)
    source = WeightsFile(path)
    assert source.read({"b": (torch.Size([2]), torch.float32)})["b"].dtype == torch.float32
    with pytest.raises(WeightsError, match=r"\(first: w is int32 in the file but float32 in the model\)"):
        source.read({"w": (torch.Size([2, 2]), torch.float32)})
