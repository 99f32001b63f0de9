"""Search time of every planner on the paper's branchy models (docs/method.md §6): writes results.json and
prints the README tables.

    .venv/bin/python benchmarks/search_time/run.py            # all models, 4..32 devices, 3 rounds
    .venv/bin/python benchmarks/search_time/run.py --models mmt --devices 8 --rounds 1

Each configuration runs every planner once per round, one after the other, so a ratio of two
planners compares runs made seconds apart on the same machine. Reported: the median of the
rounds, and for the ratios the median and the spread (lowest-highest) of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.errors import PlanningError
from graphpipe.graph.capture import capture
from graphpipe.models import load_model
from graphpipe.planner.api import plan_candidates

PLANNERS = ("graphpipe", "sequential", "parallel-only", "pipedream", "piper")
BASELINES = ("pipedream", "piper")
HERE = Path(__file__).parent


def measure(graph: Any, costs: Any, num_devices: int, batch: int, planner: str) -> dict[str, Any]:
    cluster = cluster_preset("summit", num_devices)
    start = time.perf_counter()
    try:
        plans = plan_candidates(graph, costs, cluster, batch, planner=planner)
    except PlanningError as err:
        return {"seconds": time.perf_counter() - start, "gave_up": str(err)}
    best = plans[0]
    return {"seconds": time.perf_counter() - start, "tps_ms": best.predicted_tps_ms,
            "samples_per_s": best.predicted_samples_per_s, "stages": best.num_stages, "depth": best.depth,
            "micro_batch": best.stages[0].micro_batch_size, "devices_used": best.world_size}


def summarise(model: str, ops: int, num_devices: int, planner: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row: the last round's plan, every round's seconds and their median."""
    seconds = [run["seconds"] for run in runs]
    return {"model": model, "ops": ops, "planner": planner, "devices": num_devices, **runs[-1],
            "seconds": statistics.median(seconds), "rounds": seconds}


def ratios(rows: list[dict[str, Any]], model: str, devices: int, baseline: str) -> list[float]:
    """Per-round baseline / graphpipe seconds (empty when the baseline gave up)."""
    cells = {r["planner"]: r for r in rows if r["model"] == model and r["devices"] == devices}
    base, other = cells.get("graphpipe"), cells.get(baseline)
    if not base or not other or "gave_up" in other:
        return []
    return [b / g for g, b in zip(base["rounds"], other["rounds"])]


def ratio_cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f}x ({min(values):.1f}-{max(values):.1f})"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | devices | " + " | ".join(PLANNERS) + " | pipedream / graphpipe | piper / graphpipe |",
             "|---|---:|" + "---:|" * (len(PLANNERS) + 2)]
    for model, devices in sorted({(r["model"], r["devices"]) for r in rows}):
        cells = {r["planner"]: r for r in rows if r["model"] == model and r["devices"] == devices}

        def cell(name: str, cells: dict[str, dict[str, Any]] = cells) -> str:
            r = cells.get(name)
            if r is None:
                return "-"
            if "gave_up" in r:
                return f"gave up ({r['seconds']:.2f} s)"
            return f"{r['seconds']:.2f} s (d{r['depth']}, b{r['micro_batch']})"

        lines.append(f"| {model} | {devices} | " + " | ".join(cell(p) for p in PLANNERS) + " | "
                     + " | ".join(ratio_cell(ratios(rows, model, devices, b)) for b in BASELINES) + " |")
    return "\n".join(lines)


def quality_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | devices | graphpipe TPS ms | sequential / graphpipe | pipedream / graphpipe |",
             "|---|---:|---:|---:|---:|"]
    for model, devices in sorted({(r["model"], r["devices"]) for r in rows}):
        cells = {r["planner"]: r for r in rows if r["model"] == model and r["devices"] == devices}
        base = cells.get("graphpipe", {}).get("tps_ms")
        if base is None:
            continue

        def versus(name: str, cells: dict[str, dict[str, Any]] = cells, base: float = base) -> str:
            tps = cells.get(name, {}).get("tps_ms")
            return "-" if tps is None else f"{tps / base:.2f}"

        lines.append(f"| {model} | {devices} | {base:.4f} | {versus('sequential')} | {versus('pipedream')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mmt,dlrm,candle_uno")
    parser.add_argument("--devices", default="4,8,16,32")
    parser.add_argument("--batch", type=int, default=128, help="mini-batch size (default 128)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every planner per configuration (default 3)")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for model in args.models.split(","):
        zoo = load_model(model, "paper", device="meta")
        graph = capture(zoo.model, zoo.inputs, name=f"{model}-paper")
        costs = analytic_costs(graph, "v100-16gb")
        for num_devices in (int(d) for d in args.devices.split(",")):
            runs: dict[str, list[dict[str, Any]]] = {planner: [] for planner in PLANNERS}
            for _ in range(args.rounds):
                for planner in PLANNERS:
                    runs[planner].append(measure(graph, costs, num_devices, args.batch, planner))
            for planner in PLANNERS:
                row = summarise(model, len(graph), num_devices, planner, runs[planner])
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"batch": args.batch, "cluster": "summit", "costs": "analytic v100-16gb",
                                          "rounds": args.rounds, "machine": platform.platform(), "rows": rows},
                                         indent=1) + "\n")
    print(table(rows))
    print()
    print(quality_table(rows))


if __name__ == "__main__":
    main()
