"""The zero-bubble schedule against 1F1B on this CPU: simulated gain, and the gain `graphpipe train` measures.

    .venv/bin/python benchmarks/techniques/split_backward_cpu.py             # ~5 minutes on 2 cores
    .venv/bin/python benchmarks/techniques/split_backward_cpu.py --rounds 1 --steps 3

One plan (`graphpipe plan`, local-cpu, 2 devices: a 2-stage pipeline of mmt's tiny preset widened so that an op
is more than Python overhead), trained by `graphpipe train` on 2 ranks of one thread each (gloo) with
`--schedule 1f1b` and `--schedule zero-bubble`, alternately, round after round, so that machine noise hits both
alike. Per run: the median iteration of the steps after the first; per schedule: the median over the rounds and
its spread (min-max); and the median over the rounds of each round's own ratio. The simulated iterations are the
ones `graphpipe train` prints beside them (the plan's costs and cluster). Writes `split_backward_cpu.json` beside
this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEDULES = ("1f1b", "zero-bubble")
WIDE = ("num_branches=2", "num_layers=2", "hidden=64", "ffn_hidden=256", "seq_len=32")


def graphpipe(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "graphpipe.cli.main", *argv], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"graphpipe {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return done


def plan_once(path: Path, mini_batch: int, micro_batch: int) -> dict[str, Any]:
    sets = [arg for pair in (("--set", item) for item in WIDE) for arg in pair]
    graphpipe("plan", "--model", "mmt", "--preset", "tiny", *sets, "--cluster", "local-cpu", "--devices", "2",
              "--mini-batch", str(mini_batch), "--micro-batch-sizes", str(micro_batch), "--use-all-devices",
              "-o", str(path))
    plan: dict[str, Any] = json.loads(path.read_text())
    return plan


def train_once(path: Path, schedule: str, steps: int) -> tuple[float, float]:
    """(median measured iteration s of the steps after the first, simulated iteration s)."""
    done = graphpipe("train", "--plan", str(path), "--nproc", "2", "--steps", str(steps), "--schedule", schedule,
                     "--json")
    rows = json.loads(done.stdout)["steps"]
    return statistics.median(row["iteration_s"] for row in rows[1:]), float(rows[0]["simulated_iteration_s"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mini-batch", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--out", type=Path, default=HERE / "split_backward_cpu.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "plan.json"
        plan = plan_once(path, args.mini_batch, args.micro_batch)
        measured: dict[str, list[float]] = {schedule: [] for schedule in SCHEDULES}
        simulated: dict[str, float] = {}
        for round_ in range(args.rounds):
            order = SCHEDULES if round_ % 2 == 0 else tuple(reversed(SCHEDULES))
            for schedule in order:
                seconds, simulated[schedule] = train_once(path, schedule, args.steps)
                measured[schedule].append(seconds)
                print(f"round {round_ + 1}/{args.rounds} {schedule:11s} {seconds * 1e3:7.2f} ms "
                      f"(simulated {simulated[schedule] * 1e3:.2f} ms)", flush=True)
    medians = {schedule: statistics.median(times) for schedule, times in measured.items()}
    result = {
        "plan": {"stages": len(plan["stages"]), "micro_batch": args.micro_batch, "mini_batch": args.mini_batch,
                 "model": "mmt tiny " + " ".join(WIDE)},
        "rounds": args.rounds, "steps": args.steps,
        "measured_ms": {s: {"median": medians[s] * 1e3, "min": min(t) * 1e3, "max": max(t) * 1e3}
                        for s, t in measured.items()},
        "simulated_ms": {s: v * 1e3 for s, v in simulated.items()},
        "measured_ms_per_round": measured,
        "measured_gain": medians["1f1b"] / medians["zero-bubble"],
        "measured_gain_per_round": statistics.median(one / split for one, split in zip(measured["1f1b"],
                                                                                     measured["zero-bubble"])),
        "simulated_gain": simulated["1f1b"] / simulated["zero-bubble"],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"zero-bubble over 1F1B: simulated {result['simulated_gain']:.3f}x, measured {result['measured_gain']:.3f}x "
          f"(medians of {args.rounds} rounds; median of the rounds' own ratios "
          f"{result['measured_gain_per_round']:.3f}x); wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
