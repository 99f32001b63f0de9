"""Capture time per library model: ops and seconds of `gp.capture`, the model built as `graphpipe plan` builds it
(under `graphpipe.empty_weights()`: parameters on meta, so torch.export runs on host placeholders; with its
weights where shape propagation needs values, as LLaVA's `.item()` does).

    .venv/bin/python benchmarks/capture/run.py                 # results.json, a table on stdout
    .venv/bin/python benchmarks/capture/run.py --repeats 3 --only llava,clip_vit_b32

Every model is built once and captured `--repeats` times in this process after one capture to warm up
(torch.export's first call in a process imports and compiles more); reported: the median and the spread.
Run it on a quiet machine: it times the CPU.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

import graphpipe as gp  # noqa: E402
from graphpipe.errors import GraphCaptureError  # noqa: E402
from tests.corpus import cli_factories  # noqa: E402


def models() -> dict[str, Callable[[], tuple[Any, Any]]]:
    """name -> builder of (model, example inputs), the corpus's library models and two larger ones."""
    found: dict[str, Callable[[], tuple[Any, Any]]] = {}
    for name, factory in inspect.getmembers(cli_factories, inspect.isfunction):
        if factory.__module__ == cli_factories.__name__ and not name.startswith("_"):
            found[name] = (lambda f=factory: f(dtype="float32")[:2])
    found["clip_vit_b32"] = _clip_vit_b32
    found["llama_7b_8_layers"] = _llama_7b
    return found


def _clip_vit_b32() -> tuple[Any, Any]:
    """CLIP's two towers at ViT-B/32's and CLIP text's shapes (benchmarks/real_models)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "real_models"))
    from run import clip_spec  # type: ignore[import-not-found]

    spec = clip_spec(quick=False)
    return spec.build(), spec.inputs(4)


def _llama_7b() -> tuple[Any, Any]:
    sys.path.insert(0, str(ROOT / "examples"))
    from llama import factory  # type: ignore[import-not-found]

    model, inputs, _, _ = factory("paper", batch_size=4, layers=8)
    return model, inputs


def time_capture(build: Callable[[], tuple[Any, Any]], repeats: int) -> dict[str, Any]:
    """As `graphpipe plan` does: without weights, or with them where shape propagation needs values."""
    weights = "empty"
    try:
        with gp.empty_weights():
            model, inputs = build()
        graph = gp.capture(model, inputs)  # warm-up
    except GraphCaptureError:
        weights = "real"
        model, inputs = build()
        graph = gp.capture(model, inputs)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        graph = gp.capture(model, inputs)
        seconds.append(time.perf_counter() - start)
    return {"ops": len(graph.ops), "capture": graph.capture, "weights": weights,
            "median_s": statistics.median(seconds),
            "min_s": min(seconds), "max_s": max(seconds), "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    chosen = {name: build for name, build in models().items() if not args.only or name in args.only.split(",")}
    rows = {}
    print(f"{'model':<20} {'capture':<14} {'weights':<8} {'ops':>5} {'median s':>9} {'min-max s':>13}")
    for name, build in chosen.items():
        try:
            rows[name] = row = time_capture(build, args.repeats)
        except GraphCaptureError as err:
            rows[name] = {"error": str(err)}
            print(f"{name:<20} does not capture: {str(err)[:100]}", flush=True)
            continue
        print(f"{name:<20} {row['capture']:<14} {row['weights']:<8} {row['ops']:>5} {row['median_s']:>9.2f} "
              f"{row['min_s']:>6.2f}-{row['max_s']:<6.2f}", flush=True)
    Path(args.out).write_text(json.dumps({"torch": torch.__version__, "threads": 1, "models": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
