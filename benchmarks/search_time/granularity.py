"""Plan quality at layer and auto granularity against op granularity: simulated throughput of `gp.plan`'s
plan on the paper's models (paper presets, analytic V100 costs, Summit) at 4-32 devices. Writes
granularity.json and prints the README's table.

    .venv/bin/python benchmarks/search_time/granularity.py                 # about 20 seconds
    .venv/bin/python benchmarks/search_time/granularity.py --models dlrm --devices 8 --batches 128

No timing is compared here (the search times are in run.py's sweeps); the throughputs are the
simulator's and do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.graph.capture import capture
from graphpipe.models import load_model
from graphpipe.planning import plan

HERE = Path(__file__).parent
GRANULARITIES = ("op", "layer", "auto")
WITHIN = 0.02  # layer level within 2% of op level


def measure(model: str, devices: list[int], batches: list[int]) -> list[dict[str, Any]]:
    zoo = load_model(model, "paper", device="meta")
    graph = capture(zoo.model, zoo.inputs, name=f"{model}-paper")
    costs = analytic_costs(graph, "v100-16gb")
    rows = []
    for batch in batches:
        for num_devices in devices:
            row: dict[str, Any] = {"model": model, "devices": num_devices, "batch": batch}
            for granularity in GRANULARITIES:
                best = plan(graph, costs, cluster_preset("summit", num_devices), batch, granularity=granularity)
                row[granularity] = {"samples_per_s": best.predicted_samples_per_s, "seconds": best.search_time_s,
                                    "depth": best.depth, "stages": best.num_stages,
                                    "micro_batch": best.stages[0].micro_batch_size}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | mini-batch | devices | op samples/s | layer / op | auto / op | op wins by > 2% |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        op = row["op"]["samples_per_s"]
        layer, auto = row["layer"]["samples_per_s"] / op, row["auto"]["samples_per_s"] / op
        lines.append(f"| {row['model']} | {row['batch']} | {row['devices']} | {op:,.0f} | {layer:.3f} | {auto:.3f} | "
                     + ("yes" if layer < 1 - WITHIN else "") + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mmt,dlrm,candle_uno")
    parser.add_argument("--devices", default="4,8,16,32")
    parser.add_argument("--batches", default="128,1024", help="mini-batch sizes (default 128,1024)")
    parser.add_argument("--out", default=str(HERE / "granularity.json"))
    args = parser.parse_args()
    devices = [int(d) for d in args.devices.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    rows = [row for model in args.models.split(",") for row in measure(model, devices, batches)]
    Path(args.out).write_text(json.dumps({"cluster": "summit", "costs": "analytic v100-16gb", "rows": rows},
                                         indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
