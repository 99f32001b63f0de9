"""Recomputation and the zero-bubble schedule as planner choices (`--techniques all`), simulated on Summit.

    .venv/bin/python benchmarks/techniques/run.py            # the tables and the plot, ~15 minutes on 2 cores
    .venv/bin/python benchmarks/techniques/run.py --quick    # one model, one device count, seconds

For mmt, dlrm and candle_uno (the paper's sizes) and CLIP's two towers (Hugging Face, ViT-B/32 + text, built
from its config on the meta device), on 8, 16 and 32 V100s of the simulated Summit cluster, layer granularity,
analytic costs, every plan simulated on its own schedule:

- regime "rule": the paper's memory rule (the mini-batch whose activations fit on the devices,
  `benchmarks/paper`'s `rule_mini_batch`) at the device's 16 GiB;
- regimes "bind x": the same mini-batch under a memory limit of x times the peak of graphpipe's plan without
  the choices, where that limit binds (the plan without the choices changes or finds nothing).

Per configuration: graphpipe and the `sequential` planner (the chain DP), each without and with the choices.
Columns (a) graphpipe with the choices over graphpipe without, (b) graphpipe with the choices over the sequential
planner with the same choices. Then graphpipe's and the sequential planner's throughput against the memory limit
for mmt at 8 devices (`throughput_vs_memory.png`). Writes `results.json` and prints the tables (markdown).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _sibling(folder: str) -> Any:
    """`benchmarks/<folder>/run.py` as a module of its own name (both siblings are called run.py)."""
    spec = importlib.util.spec_from_file_location(f"{folder}_run", HERE.parent / folder / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


paper = _sibling("paper")  # the paper's models, their analytic costs and its memory rule
real = _sibling("real_models")  # CLIP's towers from their config

GIB = 2**30
VARIANTS = (("graphpipe", "none"), ("graphpipe", "all"), ("sequential", "none"), ("sequential", "all"))


@dataclass(frozen=True)
class Config:
    """What one run asks: model, devices, mini-batch, memory limit (None: the device's), planner, techniques."""

    model: str
    num_devices: int
    mini_batch: int
    regime: str
    memory_limit_gib: float | None
    planner: str
    techniques: str


@dataclass(frozen=True)
class Outcome:
    config: Config
    samples_per_s: float | None  # None: no plan fits
    depth: int = 0
    num_stages: int = 0
    micro_batch: int = 0
    recomputing: int = 0
    schedule: str = ""
    peak_gib: float = 0.0
    search_s: float = 0.0
    reason: str = ""


class Models:
    """Graphs and analytic V100 costs, built once per model."""

    def __init__(self, quick: bool) -> None:
        self.setup = paper.QUICK if quick else paper.FULL
        self.work = paper.Workload(self.setup)
        self.quick = quick
        self._clip: tuple[Any, Any] | None = None

    def graph_and_costs(self, model: str) -> tuple[Any, Any]:
        if model != "clip":
            return self.work.graph_and_costs(model, {})
        if self._clip is None:
            spec = real.clip_spec(quick=self.quick)
            setup = real.Setup(quick=self.quick)
            workload = real.capture_model(spec, setup)
            self._clip = (workload.graph, workload.costs)
        return self._clip

    def rule_mini_batch(self, model: str, num_devices: int) -> int:
        from graphpipe.cost.presets import cluster_preset

        graph, costs = self.graph_and_costs(model)
        per_sample = sum(costs.at(op, 1).act_bytes for op in graph.names)
        memory = cluster_preset("summit", num_devices).device.memory_bytes
        fitting = max(1, num_devices * memory // max(per_sample, 1))
        return 1 << (int(fitting).bit_length() - 1)


def plan_one(models: Models, config: Config) -> Outcome:
    from graphpipe.cost.presets import cluster_preset
    from graphpipe.errors import GraphPipeError
    from graphpipe.planning import plan
    from graphpipe.simulation.simulator import simulate

    graph, costs = models.graph_and_costs(config.model)
    cluster = cluster_preset("summit", config.num_devices)
    limit = None if config.memory_limit_gib is None else config.memory_limit_gib * GIB
    start = time.perf_counter()
    try:
        found = plan(graph, costs, cluster, config.mini_batch, planner=config.planner, granularity="layer",
                     memory_limit=limit, techniques=config.techniques)
    except GraphPipeError as err:
        return Outcome(config, None, search_s=time.perf_counter() - start, reason=str(err).splitlines()[0][:160])
    result = simulate(found, costs, cluster, schedule=found.schedule)
    return Outcome(config, result.samples_per_s, depth=found.depth, num_stages=found.num_stages,
                   micro_batch=found.stages[0].micro_batch_size, recomputing=len(found.recompute_stages),
                   schedule=found.schedule, peak_gib=max(result.peak_memory_bytes) / GIB,
                   search_s=time.perf_counter() - start)


def configurations(models: Models, model: str, num_devices: int, fractions: Sequence[float],
                   log: Any) -> list[Outcome]:
    """Every variant in the rule regime, then under each fraction of graphpipe's plain peak that binds."""
    batch = models.rule_mini_batch(model, num_devices)
    rule = [plan_one(models, Config(model, num_devices, batch, "rule", None, planner, techniques))
            for planner, techniques in VARIANTS]
    log(rule)
    plain = rule[0]
    if plain.samples_per_s is None:
        return rule
    found = list(rule)
    for fraction in fractions:
        limit = round(plain.peak_gib * fraction, 3)
        runs = [plan_one(models, Config(model, num_devices, batch, f"bind {fraction:g}", limit, planner, techniques))
                for planner, techniques in VARIANTS]
        binds = runs[0].samples_per_s is None or (runs[0].samples_per_s, runs[0].micro_batch, runs[0].depth) != (
            plain.samples_per_s, plain.micro_batch, plain.depth)
        if binds:
            log(runs)
            found += runs
    return found


def memory_sweep(models: Models, model: str, num_devices: int, limits_gib: Sequence[float], log: Any) -> list[Outcome]:
    batch = models.rule_mini_batch(model, num_devices)
    runs = []
    for limit in limits_gib:
        step = [plan_one(models, Config(model, num_devices, batch, "sweep", limit, planner, techniques))
                for planner, techniques in VARIANTS]
        log(step)
        runs += step
    return runs


def _tput(outcome: Outcome) -> str:
    return "no plan" if outcome.samples_per_s is None else f"{outcome.samples_per_s:,.0f}"


def _ratio(top: Outcome, bottom: Outcome) -> str:
    if top.samples_per_s is None:
        return "-"
    if bottom.samples_per_s is None:
        return "only with"
    return f"{top.samples_per_s / bottom.samples_per_s:.2f}x"


def _choice(outcome: Outcome) -> str:
    if outcome.samples_per_s is None:
        return "-"
    parts = [f"d{outcome.depth}", f"b{outcome.micro_batch}"]
    if outcome.recomputing:
        parts.append(f"{outcome.recomputing} recompute")
    if outcome.schedule == "zero-bubble":
        parts.append("zb")
    return " ".join(parts)


def table(outcomes: Sequence[Outcome]) -> str:
    lines = ["| model | devices | mini-batch | regime | limit GiB | graphpipe | graphpipe + choices (its plan) | "
             "sequential | sequential + choices (its plan) | (a) | (b) |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for start in range(0, len(outcomes), len(VARIANTS)):
        gp, gp_all, seq, seq_all = outcomes[start:start + len(VARIANTS)]
        c = gp.config
        limit = "16 (device)" if c.memory_limit_gib is None else f"{c.memory_limit_gib:.3g}"
        lines.append(f"| {c.model} | {c.num_devices} | {c.mini_batch:,} | {c.regime} | {limit} | {_tput(gp)} | "
                     f"{_tput(gp_all)} ({_choice(gp_all)}) | {_tput(seq)} | {_tput(seq_all)} ({_choice(seq_all)}) | "
                     f"{_ratio(gp_all, gp)} | {_ratio(gp_all, seq_all)} |")
    return "\n".join(lines)


def plot(runs: Sequence[Outcome], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for planner, techniques in VARIANTS:
        mine = [r for r in runs if (r.config.planner, r.config.techniques) == (planner, techniques)]
        xs = [r.config.memory_limit_gib for r in mine if r.samples_per_s is not None]
        ys = [r.samples_per_s for r in mine if r.samples_per_s is not None]
        label = planner + (" + recompute/zero-bubble" if techniques == "all" else "")
        ax.plot(xs, ys, marker="o", linestyle="-" if techniques == "all" else "--", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("memory limit per device (GiB)")
    ax.set_ylabel("simulated samples/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one model at one device count, into a temporary folder")
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json and the plot")
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="techniques-")) if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    models = Models(args.quick)
    model_names = ("mmt",) if args.quick else ("mmt", "dlrm", "candle_uno", "clip")
    device_counts = (8,) if args.quick else (8, 16, 32)
    fractions = (0.6,) if args.quick else (0.6, 0.35)
    sweep_limits = (0.3, 1.0, 4.0) if args.quick else (0.9, 1.0, 1.1, 1.3, 1.6, 2.0, 3.0, 4.0, 6.0, 10.0, 16.0)
    start = time.perf_counter()

    def log(runs: Sequence[Outcome]) -> None:
        c = runs[0].config
        print(f"[{time.perf_counter() - start:6.0f} s] {c.model} {c.num_devices} {c.regime} "
              + " | ".join(f"{r.config.planner}/{r.config.techniques}: {_tput(r)} {_choice(r)}" for r in runs),
              flush=True)

    outcomes: list[Outcome] = []
    for model in model_names:
        for num_devices in device_counts:
            outcomes += configurations(models, model, num_devices, fractions, log)
    sweep = memory_sweep(models, "mmt", 8, sweep_limits, log)
    plot(sweep, out / "throughput_vs_memory.png", "mmt, 8 V100s, mini-batch at the memory rule")
    (out / "results.json").write_text(json.dumps({
        "elapsed_s": round(time.perf_counter() - start, 1),
        "outcomes": [asdict(o) for o in outcomes], "sweep": [asdict(o) for o in sweep]}, indent=1) + "\n")
    print(table(outcomes))
    print()
    print(table(sweep))
    print(f"\nwrote {out / 'results.json'} and {out / 'throughput_vs_memory.png'} "
          f"in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
