"""`graphpipe capture` and `graphpipe demo` through the real entry point, zoo and user models."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from graphpipe.cli import main as cli_main
from graphpipe.cli.common import capture_from_args
from graphpipe.graph.op_graph import OpGraph

USER_MODEL = '''
import torch
from torch import nn

class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.left = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
        self.right = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.head = nn.Linear(16, 2)

    def forward(self, a, b):
        return self.head(torch.cat([self.left(a), self.right(b)], dim=1))

def make(batch_size=3):
    torch.manual_seed(0)
    inputs = (torch.randn(batch_size, 4), torch.randn(batch_size, 6))
    return TwoTowers(), inputs, torch.randint(0, 2, (batch_size,)), nn.CrossEntropyLoss()
'''

NEEDS_VALUES = '''
import torch
from torch import nn

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.scale = float(self.layer.weight.detach().abs().sum())  # a value read at construction: no meta weights here

    def forward(self, x):
        return self.layer(x) / self.scale

def make(batch_size=3):
    torch.manual_seed(0)
    return Scaled(), (torch.randn(batch_size, 4),), torch.randn(batch_size, 4), nn.MSELoss()
'''


@pytest.fixture(autouse=True)
def present_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register only the command modules that exist, so these tests do not depend on unrelated commands."""
    present = tuple(name for name in cli_main.COMMAND_MODULES if importlib.util.find_spec(name) is not None)
    assert "graphpipe.cli.capture_cmd" in present and "graphpipe.cli.demo_cmd" in present
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", present)


@pytest.fixture()
def user_spec(tmp_path: Path) -> str:
    path = tmp_path / "towers.py"
    path.write_text(USER_MODEL)
    return f"{path}:make"


def test_user_model_file_captures_from_the_cli(user_spec: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "graph.json"
    assert cli_main.main(["capture", "--model", user_spec, "--batch", "5", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "graph towers.make: " in text and "2 parallel chains" in text and "Linear" in text
    graph = OpGraph.load(str(out))
    assert graph.example_batch_size == 5 and graph.inputs == ("a", "b")
    assert graph.param_bytes == 4 * (4 * 8 + 8 + 8 * 8 + 8 + 6 * 8 + 8 + 16 * 2 + 2)


def test_capture_json_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["capture", "--model", "candle_uno", "--set", "num_branches=3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_branches"] == 3 and data["ops_by_type"]["placeholder"] == 3
    assert data["num_params"] > 0 and data["act_bytes_per_sample"] > 0
    assert data["fwd_flops_per_sample"] is None or data["fwd_flops_per_sample"] > 0


def test_paper_preset_captures_on_meta(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dlrm.json"
    assert cli_main.main(["capture", "--model", "dlrm", "--preset", "paper", "-o", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_params"] > 700e6 and data["max_branches"] == 14
    assert OpGraph.load(str(out)).param_bytes == data["param_bytes"] + data["buffer_bytes"]


def test_bad_model_is_an_error_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["capture", "--model", "nope"]) == 2
    assert "path/to/file.py:factory" in capsys.readouterr().err
    assert cli_main.main(["capture", "--model", "mmt", "--set", "width"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_untraceable_user_model_names_the_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gated.py"
    path.write_text(USER_MODEL.replace("return self.head(", "if a.sum() > 0:\n            a = a * 2\n"
                                       "        return self.head("))
    assert cli_main.main(["capture", "--model", f"{path}:make"]) == 1
    assert "own forward (TwoTowers)" in capsys.readouterr().err


def test_leaf_module_option_keeps_a_submodule_whole(user_spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["capture", "--model", user_spec, "--leaf-module", "left", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ops_by_type"]["Sequential"] == 1 and data["ops_by_type"]["Linear"] == 2


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["demo"]) == 0
    text = capsys.readouterr().out
    assert "graph mmt-tiny" in text and "4 parallel chains" in text


def test_capture_of_a_transformers_model_prints_branches_and_the_largest_block(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    spec = f"{Path(__file__).resolve().parents[2] / 'examples' / 'clip_towers.py'}:factory"
    args = ["capture", "--model", spec, "--set", "width=16", "--set", "layers=1"]
    assert cli_main.main(args) == 0
    text = capsys.readouterr().out
    assert "2 parallel chains between the inputs and 'cosine_similarity'" in text
    assert "largest block:" in text
    assert cli_main.main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_branches"] >= 2 and data["largest_block_ops"] < data["num_compute_ops"] / 10


def _capture_args(spec: str) -> argparse.Namespace:
    return argparse.Namespace(model=spec, preset="tiny", batch=None, model_options=[], leaf_modules=[],
                              capture="auto")


def test_a_user_factory_is_captured_without_its_weights(user_spec: str) -> None:
    """Parameters on meta (a model larger than this machine plans), the graph as with real weights."""
    zoo, graph = capture_from_args(_capture_args(user_spec))
    assert all(param.is_meta for param in zoo.model.parameters())
    assert not any(value.is_meta for value in zoo.inputs)
    assert graph.param_bytes == 4 * (4 * 8 + 8 + 8 * 8 + 8 + 6 * 8 + 8 + 16 * 2 + 2)


def test_a_factory_that_reads_its_weights_is_built_with_values(tmp_path: Path) -> None:
    path = tmp_path / "scaled.py"
    path.write_text(NEEDS_VALUES)
    zoo, graph = capture_from_args(_capture_args(f"{path}:make"))
    assert not any(param.is_meta for param in zoo.model.parameters())
    assert graph.param_bytes == 4 * (4 * 4 + 4)
