"""What one probe of the DP costs on the SP tree and on the chain of the same graph: time and rows.

    .venv/bin/python benchmarks/search_time/probe_cost.py --model two_branch --layers 4 --granularity layer
    .venv/bin/python benchmarks/search_time/probe_cost.py --model dlrm --devices 32 --batch 256 --granularity layer

Both searches make about the same number of probes per `gp.plan` call (the same narrowing on the TPS
target), so graphpipe's search time against its own chain DP's comes down to the cost of one probe. For
one micro-batch size, each tree is searched to its optimum; then a probe at the optimum (it succeeds)
and one just below it (it fails, as the narrowing's last probe does) are timed, each the least of
`--repeats`, and the chain rows the probe solved are counted (every chain, lane and branch, rows shared
by twins once). Where the rows are alike and the time is not, the difference is the work per block
that is not a chain row: the fork/join layouts, the merge stages, the parallel groupings
(docs/architecture.md, "The 1.2x target and two-branch blocks"). Analytic V100 costs, Summit.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.graph.capture import capture
from graphpipe.graph.sp import SPChain
from graphpipe.models import load_model
from graphpipe.planner.api import make_request
from graphpipe.planner.sp_dp.probe import Probe
from graphpipe.planner.sp_dp.search import TOLERANCE, Search
from graphpipe.planner.sp_dp.tables import build_tables
from graphpipe.planner.stage_cost import CostModel


def probe_cost(model: CostModel, tree: SPChain, devices: int, micro_batch: int, memory_limit: float,
               repeats: int) -> dict[str, Any]:
    """The tree's optimum at one size, then per target (at it, just below it) the least seconds of a probe and
    the rows it solved."""
    chains, pars = build_tables(model, tree)
    search = Search(model, tree, devices, micro_batch, memory_limit, chains, pars)
    if search.run() is None:
        return {"items": len(tree.items), "infeasible": True}
    out: dict[str, Any] = {"items": len(tree.items), "optimum_ms": search.hi}
    for name, target in (("at", search.hi), ("below", search.lo)):
        best, rows, found = float("inf"), 0, False
        for _ in range(repeats):
            start = time.perf_counter()
            probe = Probe(search, target)
            found = probe.best_entry() is not None
            best = min(best, time.perf_counter() - start)
            rows = sum(end for _, _, end in probe.chain_memo)
        out[name] = {"us": best * 1e6, "rows": rows, "plan": found}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="two_branch")
    parser.add_argument("--layers", type=int, default=0, help="layers per branch (0: the paper preset's)")
    parser.add_argument("--devices", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--granularity", choices=("op", "layer"), default="layer")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    zoo = load_model(args.model, "paper", device="meta", **({"num_layers": args.layers} if args.layers else {}))
    graph = capture(zoo.model, zoo.inputs)
    request = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", args.devices),
                           args.batch, granularity=args.granularity)
    print(f"{args.model} ({args.layers or 'preset'} layers), {args.granularity} level, {args.devices} devices, "
          f"mini-batch {args.batch}, micro-batch {args.micro_batch}; search tolerance {TOLERANCE}")
    print("| tree | items | probe at the optimum | rows | probe just below | rows |")
    print("|---|---|---|---|---|---|")
    for name, tree in (("SP tree", request.sp_tree), ("chain", request.chain_tree)):
        found = probe_cost(request.model, tree, args.devices, args.micro_batch, request.memory_limit, args.repeats)
        if found.get("infeasible"):
            print(f"| {name} | {found['items']} | no plan at this micro-batch | | | |")
            continue
        at, below = found["at"], found["below"]
        print(f"| {name} | {found['items']} | {at['us']:.0f} us | {at['rows']} | {below['us']:.0f} us | "
              f"{below['rows']} |")


if __name__ == "__main__":
    main()
