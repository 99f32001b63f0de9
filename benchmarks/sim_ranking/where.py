"""Where a two-rank iteration spends its time, measured against simulated, per rank and action kind.

    .venv/bin/python benchmarks/sim_ranking/where.py --model mmt --micro-batch 16

Calibrates and chooses candidates as `run.py` does, keeps those at `--micro-batch`, trains each on 2 gloo
ranks (3 warm-up steps, then 5 timed ones) and prints, per rank, the median ms per action kind from the
executor's events (`PipelineTrainer.executor.events`) and the iteration's wall time, beside the simulator's
ms per event kind (`bench_runtime.simulated_actions`, the measured op costs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "runtime"))

import run  # noqa: E402
from bench_runtime import action_times, simulated_actions, spawn_ranks  # noqa: E402
from calibrate_host import measure_link  # noqa: E402

from graphpipe.stages.stage_graph import Plan  # noqa: E402

STEPS, WARM_UP = 5, 3


def _rank_main(rank: int, port: int, item: dict[str, Any], out: Any) -> None:
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, run.WORLD + 1, is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=run.WORLD,
                                timeout=timedelta(seconds=120))
        from graphpipe.models import load_model
        from graphpipe.runtime.trainer import PipelineTrainer
        from graphpipe.train import shuffled_batch

        options = run.MODELS[item["model"]]
        zoo = load_model(item["model"], "tiny", batch_size=run.BATCH, seed=0, **options)
        inputs, targets = shuffled_batch(zoo, 0, 0)
        found = []
        for row in item["candidates"]:
            model = load_model(item["model"], "tiny", batch_size=run.BATCH, seed=0, **options).model
            trainer = PipelineTrainer(model, Plan.from_dict(row["plan"]), loss_fn=zoo.loss_fn, schedule="1f1b",
                                      optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4))
            for _ in range(WARM_UP):
                trainer.step(inputs, targets)
            walls, actions = [], []
            for _ in range(STEPS):
                dist.barrier()
                start = time.perf_counter()
                trainer.step(inputs, targets)
                walls.append(time.perf_counter() - start)
                actions.append(action_times(trainer) if not trainer.idle else {})  # a rank the plan leaves idle
            kinds = sorted({kind for step in actions for kind in step})
            found.append({"wall": 1e3 * statistics.median(walls),
                          **{kind: 1e3 * statistics.median(step.get(kind, 0.0) for step in actions) for kind in kinds}})
        out.put(("rows", rank, found))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
    out.put(("done", rank, None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mmt", choices=sorted(run.MODELS))
    parser.add_argument("--micro-batch", type=int, default=16)
    args = parser.parse_args()
    item = run.prepare(args.model, measure_link())
    item["candidates"] = [row for row in item["candidates"]
                          if Plan.from_dict(row["plan"]).stages[0].micro_batch_size == args.micro_batch]
    measured = {key: payload for kind, key, payload in spawn_ranks(run.WORLD, _rank_main, (item,), timeout_s=900)
                if kind == "rows"}
    from graphpipe.cost.cluster import Cluster

    cluster = Cluster.from_dict(item["cluster"])
    for idx, row in enumerate(item["candidates"]):
        plan = Plan.from_dict(row["plan"])
        simulated = simulated_actions(plan, item["measured_table"], cluster)
        print(f"{row['label']}: simulated iteration {row['simulated_s'] * 1e3:.2f} ms")
        for rank in range(run.WORLD):
            got = {kind: round(ms, 2) for kind, ms in measured[rank][idx].items()}
            sim = {kind: round(ms, 2) for kind, ms in simulated.get(rank, {}).items()}
            print(f"  rank {rank}: measured {got}\n          simulated {sim}")


if __name__ == "__main__":
    main()
