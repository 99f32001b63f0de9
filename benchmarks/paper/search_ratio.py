"""graphpipe's planning time against its own chain DP's (`--planner sequential`) on the stored configurations.

    .venv/bin/python benchmarks/paper/search_ratio.py                  # 3 rounds: search_ratio.json
    .venv/bin/python benchmarks/paper/search_ratio.py --rounds 5 --out /tmp/ratio.json
    .venv/bin/python benchmarks/paper/search_ratio.py --experiments scaling --granularity op --out /tmp/op.json

For each configuration of `results.json` that graphpipe planned (same model, devices, mini-batch,
granularity and options, through the benchmark's own `Workload`; `--experiments` keeps some experiments,
`--granularity` plans them all at one granularity instead of each one's own), times `gp.plan` for graphpipe and
for `sequential`, one right after the other, in every round: the whole call a user waits for (the
search, then the ranking by simulation). Each planner's time is the median of the rounds; the ratio
is the median of the per-round ratios, with its range, since runs this short vary by tens of percent
between rounds on a shared machine. The summary counts the configurations above `--limit` (1.2, the
planner's target).

Where the time goes (`searches`, per round): graphpipe's two DP searches as `plan_graphpipe` runs them,
the SP tree's and the chain's with the best graph pipeline as its ceiling (0 where the SP tree is the
chain), and `sequential`'s one, the chain's in full; the DP alone, without the request's set-up, the
building of the plans or the ranking, which both planners share.
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

from graphpipe.planner.api import make_request  # noqa: E402
from graphpipe.planner.graphpipe_planner import chain_ceiling, is_the_chain  # noqa: E402
from graphpipe.planner.request import PlanRequest  # noqa: E402
from graphpipe.planner.sp_dp import partition_sp  # noqa: E402

PLANNERS = ("graphpipe", "sequential")
SEARCHES = ("sp_tree", "chain_ceiling", "chain_full")


def configurations(results: dict[str, Any], experiments: str | None = None,
                   granularity: str | None = None) -> list[dict[str, Any]]:
    """The distinct configurations graphpipe planned, in the order of the results file; only those of
    `experiments` (comma-separated) when given, each at `granularity` instead of its own when given."""
    seen, out = set(), []
    kept = None if experiments is None else set(experiments.split(","))
    for run in results["runs"]:
        if kept is not None and run["experiment"] not in kept:
            continue
        if granularity is not None:
            run = {**run, "granularity": granularity}
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
    searches: dict[str, list[float]] = {part: [] for part in SEARCHES}
    for _ in range(rounds):
        for planner in PLANNERS:
            start = time.perf_counter()
            plan(graph, costs, cluster, run["global_batch_size"], planner=planner, **fields)
            seconds[planner].append(time.perf_counter() - start)
        requests = [make_request(graph, costs, cluster, run["global_batch_size"], every_size=True, **fields)
                    for _ in PLANNERS]
        for part, took in time_searches(*requests).items():
            searches[part].append(took)
    ratios = [g / s for g, s in zip(seconds["graphpipe"], seconds["sequential"])]
    return {"experiment": run["experiment"], "model": run["model"], "num_devices": run["num_devices"],
            "global_batch_size": run["global_batch_size"], "granularity": run["granularity"],
            "options": run["options"], "seconds": seconds, "ratios": ratios, "searches": searches}


def time_searches(request: PlanRequest, fresh: PlanRequest) -> dict[str, float]:
    """Seconds of each DP search (module docstring), each once, as `gp.plan`'s ranking asks (`every_size`):
    graphpipe's two on `request`, `sequential`'s on `fresh`, an equal request whose cost model has read no
    op's costs yet (each planner's first search pays for those reads, as in `gp.plan`)."""
    model, devices, sizes, limit = request.model, request.num_devices, request.micro_batch_sizes, request.memory_limit
    fresh.chain_tree  # noqa: B018  (the set-up is not the search: built before the clock starts, as below)
    request.sp_tree  # noqa: B018
    request.chain_tree  # noqa: B018
    start = time.perf_counter()
    found = partition_sp(model, request.sp_tree, devices, sizes, limit, every_size=True)
    graph_s = time.perf_counter() - start
    ceiling_s = 0.0
    if not is_the_chain(request.sp_tree, request.chain_tree):
        start = time.perf_counter()
        partition_sp(model, request.chain_tree, devices, sizes, limit, ceiling_ms=chain_ceiling(model, found),
                     every_size=True)
        ceiling_s = time.perf_counter() - start
    start = time.perf_counter()
    partition_sp(fresh.model, fresh.chain_tree, devices, sizes, limit, every_size=True)
    return {"sp_tree": graph_s, "chain_ceiling": ceiling_s, "chain_full": time.perf_counter() - start}


def row(entry: dict[str, Any]) -> str:
    """One markdown row: the configuration, each planner's median, the median ratio and its range, then the
    medians of the DP searches in ms (the SP tree's, the chain's with the ceiling, the chain's in full)."""
    ratios = entry["ratios"]
    medians = [statistics.median(entry["seconds"][planner]) for planner in PLANNERS]
    searches = " | ".join(f"{statistics.median(entry['searches'][part]) * 1e3:.1f}" for part in SEARCHES)
    return (f"| {entry['experiment']} | {entry['model']} | {entry['num_devices']} | {entry['global_batch_size']:,} | "
            f"{entry['granularity']} | {json.dumps(entry['options'])} | {medians[0]:.3f} | {medians[1]:.3f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {searches} |")


def search_ratio(entry: dict[str, Any]) -> float:
    """graphpipe's DP searches over `sequential`'s, the median of the per-round ratios."""
    parts = entry["searches"]
    return statistics.median((graph + ceiling) / chain for graph, ceiling, chain in
                             zip(parts["sp_tree"], parts["chain_ceiling"], parts["chain_full"]))


def summary(entries: Sequence[dict[str, Any]], limit: float) -> str:
    medians = [statistics.median(entry["ratios"]) for entry in entries]
    above = sum(ratio > limit for ratio in medians)
    searches = [search_ratio(entry) for entry in entries]
    return (f"{len(entries)} configurations: median ratio {statistics.median(medians):.2f}, "
            f"highest {max(medians):.2f}, {above} above {limit}; the DP searches alone: median "
            f"{statistics.median(searches):.2f}, highest {max(searches):.2f}, "
            f"{sum(ratio > limit for ratio in searches)} above {limit}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(HERE / "results.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=1.2)
    parser.add_argument("--out", type=Path, default=HERE / "search_ratio.json")
    parser.add_argument("--experiments", help="comma-separated experiments to time (default: all)")
    parser.add_argument("--granularity", choices=("op", "layer"), help="plan every configuration at this one")
    args = parser.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    workload = Workload(Setup(**{key: tuple(value) if isinstance(value, list) else value
                                 for key, value in results["setup"].items()}))
    print("| experiment | model | devices | mini-batch | granularity | options | graphpipe s | sequential s | "
          "ratio (range) | SP tree ms | chain, ceiling ms | chain, full ms |")
    print("|---|---|---:|---:|---|---|---:|---:|---|---:|---:|---:|")
    entries = []
    for run in configurations(results, args.experiments, args.granularity):
        entries.append(time_configuration(workload, run, args.rounds))
        print(row(entries[-1]), flush=True)
    print(f"\n{summary(entries, args.limit)}")
    args.out.write_text(json.dumps({"rounds": args.rounds, "limit": args.limit, "entries": entries,
                                    "summary": summary(entries, args.limit)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
