"""Planning time against the nesting depth of parallel branches, and for an Inception-v3-sized model.

    .venv/bin/python benchmarks/nested_branches/run.py                 # depths 1-4, 2-4 branches, Inception
    .venv/bin/python benchmarks/nested_branches/run.py --rounds 1 --no-inception

Synthetic graphs (`models.nested_graph`): the same op count at every depth, so a row compares the
nesting alone; hand-made per-op costs, 8 test devices (4 per node), mini-batch 16. Inception-like
(`models.inception_graph`, about 300 ops, captured on the meta device): analytic V100 costs on
Summit, mini-batch 128, every micro-batch size that divides it. Each cell is the median of the
rounds of `graphpipe.plan` (planner "graphpipe", ranking by simulation: the default), which plans,
ranks and validates; capture and costing are not timed. Writes results.json next to this file.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from models import bench_cluster, inception_graph, nested_costs, nested_graph  # noqa: E402

from graphpipe.cost.analytic import analytic_costs  # noqa: E402
from graphpipe.cost.presets import cluster_preset  # noqa: E402
from graphpipe.planning import plan  # noqa: E402


def timed(graph: Any, costs: Any, cluster: Any, batch: int, rounds: int) -> dict[str, Any]:
    seconds, found = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        found = plan(graph, costs, cluster, batch)
        seconds.append(time.perf_counter() - start)
    assert found is not None
    return {"ops": len(graph), "seconds": statistics.median(seconds), "rounds": seconds,
            "tps_ms": found.predicted_tps_ms, "depth": found.depth, "stages": found.num_stages,
            "micro_batch": found.stages[0].micro_batch_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="1,2,3,4")
    parser.add_argument("--branches", default="2,3,4")
    parser.add_argument("--ops", type=int, default=120, help="ops of every synthetic graph (default 120)")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-inception", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for branches in (int(b) for b in args.branches.split(",")):
        for depth in (int(d) for d in args.depths.split(",")):
            graph = nested_graph(depth, branches, args.ops)
            row = {"model": f"nested d{depth} b{branches}", "nesting": depth, "branches": branches,
                   "devices": args.devices,
                   **timed(graph, nested_costs(graph), bench_cluster(args.devices), 16, args.rounds)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if not args.no_inception:
        graph = inception_graph()
        costs = analytic_costs(graph, "v100-16gb")
        row = {"model": "inception-like", "nesting": 2, "branches": 4, "devices": args.devices,
               **timed(graph, costs, cluster_preset("summit", args.devices), 128, args.rounds)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "machine": platform.platform(), "rows": rows},
                                         indent=1) + "\n")
    print("| graph | ops | nesting | branches | devices | seconds (median) | plan |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['model']} | {r['ops']} | {r['nesting']} | {r['branches']} | {r['devices']} | "
              f"{r['seconds']:.2f} | depth {r['depth']}, {r['stages']} stages, b{r['micro_batch']} |")


if __name__ == "__main__":
    main()
