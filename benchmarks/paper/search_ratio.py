"""graphpipe's planning time against its own chain DP's (`--planner sequential`) on the stored configurations.

    .venv/bin/python benchmarks/paper/search_ratio.py                  # 3 rounds: search_ratio.json
    .venv/bin/python benchmarks/paper/search_ratio.py --rounds 5 --out /tmp/ratio.json

For each configuration of `results.json` that graphpipe planned (same model, devices, mini-batch,
granularity and options, through the benchmark's own `Workload`), times `gp.plan` for graphpipe and
for `sequential`, one right after the other, in every round: the whole call a user waits for (the
search, then the ranking by simulation). Each planner's time is the median of the rounds; the ratio
is the median of the per-round ratios, with its range, since runs this short vary by tens of percent
between rounds on a shared machine. The summary counts the configurations above `--limit` (1.2, the
planner's target).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import Setup, Workload  # noqa: E402  (the benchmark's own module, beside this one)

PLANNERS = ("graphpipe", "sequential")


def configurations(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The distinct configurations graphpipe planned, in the order of the results file."""
    seen, out = set(), []
    for run in results["runs"]:
        key = json.dumps([run["model"], run["num_devices"], run["global_batch_size"], run["granularity"],
                          run["options"]], sort_keys=True)
        if run["planner"] == "graphpipe" and run["status"] == "ok" and key not in seen:
            seen.add(key)
            out.append(run)
    return out


def time_configuration(workload: Workload, run: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Per planner, the seconds of each round's `gp.plan`, and the per-round ratios graphpipe / sequential."""
    from graphpipe.cost.presets import cluster_preset
    from graphpipe.planning import plan

    overrides = dict(run["options"])
    micro_batch, memory_gib = overrides.pop("micro_batch", None), overrides.pop("memory_limit_gib", None)
    graph, costs = workload.graph_and_costs(run["model"], overrides)
    cluster = cluster_preset(workload.setup.cluster, run["num_devices"])
    fields = dict(granularity=run["granularity"], micro_batch_sizes=None if micro_batch is None else (micro_batch,),
                  memory_limit=None if memory_gib is None else memory_gib * 2**30)
    seconds: dict[str, list[float]] = {planner: [] for planner in PLANNERS}
    for _ in range(rounds):
        for planner in PLANNERS:
            start = time.perf_counter()
            plan(graph, costs, cluster, run["global_batch_size"], planner=planner, **fields)
            seconds[planner].append(time.perf_counter() - start)
    ratios = [g / s for g, s in zip(seconds["graphpipe"], seconds["sequential"])]
    return {"experiment": run["experiment"], "model": run["model"], "num_devices": run["num_devices"],
            "global_batch_size": run["global_batch_size"], "granularity": run["granularity"],
            "options": run["options"], "seconds": seconds, "ratios": ratios}


def row(entry: dict[str, Any]) -> str:
    """One markdown row: the configuration, each planner's median, the median ratio and its range."""
    ratios = entry["ratios"]
    medians = [statistics.median(entry["seconds"][planner]) for planner in PLANNERS]
    return (f"| {entry['experiment']} | {entry['model']} | {entry['num_devices']} | {entry['global_batch_size']:,} | "
            f"{entry['granularity']} | {json.dumps(entry['options'])} | {medians[0]:.3f} | {medians[1]:.3f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


def summary(entries: Sequence[dict[str, Any]], limit: float) -> str:
    medians = [statistics.median(entry["ratios"]) for entry in entries]
    above = sum(ratio > limit for ratio in medians)
    return (f"{len(entries)} configurations: median ratio {statistics.median(medians):.2f}, "
            f"highest {max(medians):.2f}, {above} above {limit}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(HERE / "results.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=1.2)
    parser.add_argument("--out", type=Path, default=HERE / "search_ratio.json")
    args = parser.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    workload = Workload(Setup(**{key: tuple(value) if isinstance(value, list) else value
                                 for key, value in results["setup"].items()}))
    print("| experiment | model | devices | mini-batch | granularity | options | graphpipe s | sequential s | "
          "ratio (range) |")
    print("|---|---|---:|---:|---|---|---:|---:|---|")
    entries = []
    for run in configurations(results):
        entries.append(time_configuration(workload, run, args.rounds))
        print(row(entries[-1]), flush=True)
    print(f"\n{summary(entries, args.limit)}")
    args.out.write_text(json.dumps({"rounds": args.rounds, "limit": args.limit, "entries": entries,
                                    "summary": summary(entries, args.limit)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
