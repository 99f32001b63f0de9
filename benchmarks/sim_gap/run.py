"""How far `graphpipe train`'s simulated iteration is from the measured one, with the default costs.

    .venv/bin/python benchmarks/sim_gap/run.py                  # 3 rounds: results.json, a table per round
    .venv/bin/python benchmarks/sim_gap/run.py --rounds 1 --steps 30 --only mmt

Each case runs `graphpipe train --json` as a user would (it plans on `local-cpu` with analytic `cpu` costs,
then trains on gloo workers) and compares the median iteration of the steps after the first five with the
simulated iteration the run reports; every case once per round, rounds one after the other, so that the
rounds show how much the measurement itself moves between runs. Run it on a quiet machine: it times the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FACTORIES = ROOT / "tests" / "corpus" / "cli_factories.py"
WARM_UP = 5  # steps left out: the first ones build the process groups and warm the allocator
CASES: dict[str, list[str]] = {  # name -> `graphpipe train` options
    "mmt": ["--model", "mmt", "--preset", "tiny", "--nproc", "4"],  # the README's command
    "mamba": ["--model", f"{FACTORIES}:mamba", "--nproc", "2"],
    "qwen2": ["--model", f"{FACTORIES}:qwen2", "--nproc", "2"],
    "clip": ["--model", f"{FACTORIES}:clip", "--nproc", "2"],
}


def measure(options: list[str], steps: int) -> dict[str, Any]:
    """Median, min and max measured iteration (ms) after the warm-up, the simulated one, their ratio."""
    argv = [sys.executable, "-m", "graphpipe.cli.main", "train", *options, "--steps", str(steps), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(options)} failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    rows = report["steps"][WARM_UP:]
    measured = [row["iteration_s"] * 1e3 for row in rows]
    simulated = rows[0]["simulated_iteration_s"] * 1e3
    median = statistics.median(measured)
    return {"measured_median_ms": median, "measured_min_ms": min(measured), "measured_max_ms": max(measured),
            "simulated_ms": simulated, "error": simulated / median - 1, "steps": len(measured),
            "calibrated": report["simulation_calibrated"], "stages": report["num_stages"],
            "world_size": report["world_size"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    chosen = [name for name in CASES if not args.only or name in args.only.split(",")]
    rounds = []
    for _ in range(args.rounds):
        rounds.append({name: {"options": CASES[name], **measure(CASES[name], args.steps)} for name in chosen})
        print(render(rounds[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"steps": args.steps, "warm_up": WARM_UP, "rounds": rounds}, indent=1))


def render(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'case':8} {'ranks':>5} {'measured ms (median [min, max])':>32} {'simulated ms':>13} {'error':>7}"]
    for name, row in results.items():
        spread = f"{row['measured_median_ms']:.2f} [{row['measured_min_ms']:.2f}, {row['measured_max_ms']:.2f}]"
        lines.append(f"{name:8} {row['world_size']:>5} {spread:>32} {row['simulated_ms']:>13.2f} "
                     f"{row['error']:>+7.0%}")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
