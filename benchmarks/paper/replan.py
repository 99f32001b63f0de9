"""Plan the stored configurations again with the current code: does a planner still simulate as recorded?

    .venv/bin/python benchmarks/paper/replan.py                      # graphpipe, every stored configuration
    .venv/bin/python benchmarks/paper/replan.py --planner sequential --results path/to/results.json

For each configuration of `results.json` where the planner found a plan, plans it again (same model,
devices, mini-batch, granularity and options, through the benchmark's own `Workload`), simulates it,
and prints the stored and the new samples/s beside the stored `sequential` plan's. A planner change
that should leave every plan's simulated time alone (a faster search) is checked this way against the
full benchmark in a minute or two, without the baselines. Exit status 1 when any configuration moved.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import Run, Setup, Workload  # noqa: E402  (the benchmark's own module, beside this one)

RELATIVE = 1e-9  # samples/s closer than this count as the same


def _config(run: dict[str, Any]) -> str:
    return json.dumps([run["model"], run["num_devices"], run["global_batch_size"], run["granularity"],
                       run["options"]], sort_keys=True)


def replan(results: dict[str, Any], planner: str) -> list[tuple[dict[str, Any], Run, float | None]]:
    """(stored run, new run, stored `sequential` samples/s or None) per configuration the planner had planned."""
    setup = Setup(**{key: tuple(value) if isinstance(value, list) else value
                     for key, value in results["setup"].items()})
    workload = Workload(setup)
    chains = {_config(run): run["samples_per_s"] for run in results["runs"]
              if run["planner"] == "sequential" and run["status"] == "ok"}
    out, seen = [], set()
    for run in results["runs"]:
        key = _config(run)
        if run["planner"] != planner or run["status"] != "ok" or key in seen:
            continue
        seen.add(key)
        overrides = dict(run["options"])
        micro_batch, memory_gib = overrides.pop("micro_batch", None), overrides.pop("memory_limit_gib", None)
        base = Run(experiment=run["experiment"], model=run["model"], num_devices=run["num_devices"],
                   global_batch_size=run["global_batch_size"], planner=planner, granularity=run["granularity"],
                   options=run["options"])
        out.append((run, workload._plan_and_simulate(base, overrides, micro_batch, memory_gib), chains.get(key)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", default="graphpipe")
    parser.add_argument("--results", default=str(HERE / "results.json"))
    args = parser.parse_args(argv)
    rows = replan(json.loads(Path(args.results).read_text()), args.planner)
    moved = 0
    print("| experiment | model | devices | mini-batch | options | stored | now | sequential (stored) |")
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for stored, new, chain in rows:
        same = new.ok and abs(new.samples_per_s - stored["samples_per_s"]) <= RELATIVE * stored["samples_per_s"]
        moved += not same
        print(f"| {stored['experiment']} | {stored['model']} | {stored['num_devices']} | "
              f"{stored['global_batch_size']:,} | {json.dumps(stored['options'])} | {stored['samples_per_s']:,.1f} | "
              f"{new.samples_per_s:,.1f}{'' if same else ' (moved)'} | "
              f"{'-' if chain is None else f'{chain:,.1f}'} |")
    print(f"\n{len(rows)} configurations, {moved} moved")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
