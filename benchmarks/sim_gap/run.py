"""How far `graphpipe train`'s simulated iteration is from the measured one, with the default costs.

    .venv/bin/python benchmarks/sim_gap/run.py                  # 3 rounds: results.json, a table per round
    .venv/bin/python benchmarks/sim_gap/run.py --rounds 1 --steps 30 --only mmt

First `graphpipe calibrate` measures this host into a folder of its own (the user's kept calibration is
neither read nor changed). Then each case runs `graphpipe train --json` as a user would, twice: with the
`local-cpu` preset as shipped (analytic `cpu` costs) and with this host calibrated (the same command, the
calibration's folder as `GRAPHPIPE_CACHE_DIR`). It plans on `local-cpu`, trains on gloo workers, and the
median iteration of the steps after the first five is compared with the simulated iteration the run reports;
every case once per round, rounds one after the other, so that the rounds show how much the measurement
itself moves between runs. Run it on a quiet machine: it times the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from graphpipe.cost.host_cache import CACHE_ENV

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


def graphpipe(argv: list[str], cache: str) -> subprocess.CompletedProcess[str]:
    """`graphpipe ARGV` with `cache` as the host cache folder."""
    return subprocess.run([sys.executable, "-m", "graphpipe.cli.main", *argv], capture_output=True, text=True,
                          timeout=900, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", CACHE_ENV: cache})


def measure(options: list[str], steps: int, cache: str) -> dict[str, Any]:
    """Median, min and max measured iteration (ms) after the warm-up, the simulated one, their ratio."""
    done = graphpipe(["train", *options, "--steps", str(steps), "--json"], cache)
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
    with tempfile.TemporaryDirectory() as calibrated, tempfile.TemporaryDirectory() as shipped:
        done = graphpipe(["calibrate", "--keep-noisy", "--json"], calibrated)
        if done.returncode != 0:
            raise RuntimeError(f"graphpipe calibrate failed: {done.stderr[-2000:]}")
        calibration = json.loads(done.stdout)
        print(f"calibrated: {calibration['details']['host']}", flush=True)
        rounds = []
        for _ in range(args.rounds):
            rounds.append({f"{name} {label}": {"options": CASES[name], "costs": label,
                                               **measure(CASES[name], args.steps, cache)}
                           for name in chosen for label, cache in (("shipped", shipped), ("calibrated", calibrated))})
            print(render(rounds[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"steps": args.steps, "warm_up": WARM_UP, "calibration": calibration,
                                          "rounds": rounds}, indent=1))


def render(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'case':18} {'ranks':>5} {'measured ms (median [min, max])':>32} {'simulated ms':>13} {'error':>7}"]
    for name, row in results.items():
        spread = f"{row['measured_median_ms']:.2f} [{row['measured_min_ms']:.2f}, {row['measured_max_ms']:.2f}]"
        lines.append(f"{name:18} {row['world_size']:>5} {spread:>32} {row['simulated_ms']:>13.2f} "
                     f"{row['error']:>+7.0%}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
