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


def _stored(run: dict[str, Any]) -> Run:
    """A stored run as the benchmark's `Run` (its `key` names the configuration)."""
    fields = {name: run[name] for name in ("experiment", "model", "num_devices", "global_batch_size", "planner",
                                           "granularity", "options")}
    return Run(**fields)


def replan(results: dict[str, Any], planner: str) -> list[tuple[dict[str, Any], Run, float | None]]:
    """(stored run, new run, stored `sequential` samples/s or None) per configuration the planner had planned,
    each planned again through the benchmark's own `Workload.run`."""
    setup = Setup(**{key: tuple(value) if isinstance(value, list) else value
                     for key, value in results["setup"].items()})
    workload = Workload(setup)
    chains = {_stored(run).key[1:]: run["samples_per_s"] for run in results["runs"]
              if run["planner"] == "sequential" and run["status"] == "ok"}
    out, seen = [], set()
    for run in results["runs"]:
        key = _stored(run).key[1:]  # the configuration, whichever experiment planned it
        if run["planner"] != planner or run["status"] != "ok" or key in seen:
            continue
        seen.add(key)
        overrides = dict(run["options"])
        micro_batch, memory_gib = overrides.pop("micro_batch", None), overrides.pop("memory_limit_gib", None)
        new = workload.run(run["experiment"], run["model"], run["num_devices"], run["global_batch_size"], planner,
                           granularity=run["granularity"], overrides=overrides, micro_batch=micro_batch,
                           memory_limit_gib=memory_gib)
        out.append((run, new, chains.get(key)))
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
