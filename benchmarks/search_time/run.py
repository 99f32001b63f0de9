"""Search time of every planner on the paper's branchy models (PAPER.md §6): writes results.json and
prints the README table.

    .venv/bin/python benchmarks/search_time/run.py            # all models, 4..32 devices
    .venv/bin/python benchmarks/search_time/run.py --models mmt --devices 8
"""

from __future__ import annotations

import argparse
import json
import platform
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
HERE = Path(__file__).parent


def measure(graph: Any, costs: Any, num_devices: int, batch: int, planner: str) -> dict[str, Any]:
    cluster = cluster_preset("summit", num_devices)
    start = time.perf_counter()
    try:
        plans = plan_candidates(graph, costs, cluster, batch, planner=planner)
    except PlanningError as err:
        return {"planner": planner, "devices": num_devices, "seconds": time.perf_counter() - start,
                "gave_up": str(err)}
    best = plans[0]
    return {"planner": planner, "devices": num_devices, "seconds": time.perf_counter() - start,
            "tps_ms": best.predicted_tps_ms, "samples_per_s": best.predicted_samples_per_s,
            "stages": best.num_stages, "depth": best.depth, "micro_batch": best.stages[0].micro_batch_size,
            "devices_used": best.world_size}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | devices | " + " | ".join(PLANNERS) + " | pipedream / graphpipe | piper / graphpipe |",
             "|---|---:|" + "---:|" * (len(PLANNERS) + 2)]
    keys = sorted({(r["model"], r["devices"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for model, devices in keys:
        cells = {r["planner"]: r for r in rows if r["model"] == model and r["devices"] == devices}

        def cell(name: str, cells: dict[str, dict[str, Any]] = cells) -> str:
            r = cells.get(name)
            if r is None:
                return "-"
            if "gave_up" in r:
                return f"gave up ({r['seconds']:.2f} s)"
            return f"{r['seconds']:.2f} s (d{r['depth']}, b{r['micro_batch']})"

        def ratio(name: str, cells: dict[str, dict[str, Any]] = cells) -> str:
            base, other = cells.get("graphpipe"), cells.get(name)
            if not base or not other or "gave_up" in other:
                return "-"
            return f"{other['seconds'] / base['seconds']:.1f}x"

        lines.append(f"| {model} | {devices} | " + " | ".join(cell(p) for p in PLANNERS)
                     + f" | {ratio('pipedream')} | {ratio('piper')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mmt,dlrm,candle_uno")
    parser.add_argument("--devices", default="4,8,16,32")
    parser.add_argument("--batch", type=int, default=128, help="mini-batch size (default 128)")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for model in args.models.split(","):
        zoo = load_model(model, "paper", device="meta")
        graph = capture(zoo.model, zoo.inputs, name=f"{model}-paper")
        costs = analytic_costs(graph, "v100-16gb")
        for num_devices in (int(d) for d in args.devices.split(",")):
            for planner in PLANNERS:
                row = {"model": model, "ops": len(graph), **measure(graph, costs, num_devices, args.batch, planner)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"batch": args.batch, "cluster": "summit", "costs": "analytic v100-16gb",
                                          "machine": platform.platform(), "rows": rows}, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
