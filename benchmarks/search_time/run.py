"""Search time of every planner against the model's size and the number of devices, at op and layer
granularity: writes results.json and search_time.png and prints the README's tables.

    .venv/bin/python benchmarks/search_time/run.py                     # both sweeps, 3 rounds (about 1 h)
    .venv/bin/python benchmarks/search_time/run.py --sweep ops --rounds 1 --planners graphpipe,sequential

Two sweeps (analytic V100 costs, Summit, mini-batch 128, every power-of-two micro-batch):
- ops: MMT with 4 branches of 8, 16, 32, 64 layers and the transformer chain with 32, 64, 128 layers,
  at 32 devices;
- devices: MMT with 4 branches of 32 layers at 8, 32, 128, 512 and 1,024 devices.

Three more, run on their own (`--sweep`): `baselines` (the paper's models against PipeDream and Piper),
`families` (two_branch, dlrm and candle_uno with 4, 16 and 32 layers per branch at 32 devices) and
`library` (a model the project did not write: Hugging Face CLIP's text and vision towers,
`examples/clip_towers.py`, 24 layers each, width 1,024, at 8 and 64 devices; its attention's q, k and v
projections are parallel blocks inside each tower), and `decoder` (`examples/llama.py` with Llama-7B's shapes,
8 and 32 layers, at 64 devices: the rotary embedding nests a two-level block in the q and k projections of
every layer).

Every run is one `gp.plan` call (search, then the ranking by simulation that every planner gets) in
its own process, so its peak resident memory is its own and a run past `--limit` seconds is stopped.
A planner and granularity stopped at one size is not run at the larger sizes of that sweep. Within a
round every planner runs once, one after the other, so a ratio compares runs made seconds apart on
the same machine; reported are the median of the rounds and the median (lowest-highest) of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
PLANNERS = ("graphpipe", "sequential", "pipedream", "piper")
GRANULARITIES = ("op", "layer")
BATCH = 128
SWEEPS: dict[str, list[tuple[str, int, int]]] = {  # (model, layers per branch, devices)
    "ops": [("mmt", 8, 32), ("mmt", 16, 32), ("mmt", 32, 32), ("mmt", 64, 32),
            ("transformer", 32, 32), ("transformer", 64, 32), ("transformer", 128, 32)],
    "devices": [("mmt", 32, 8), ("mmt", 32, 32), ("mmt", 32, 128), ("mmt", 32, 512), ("mmt", 32, 1024)],
    # the paper's models as the paper sizes them (layers 0: the preset's), against the baselines
    "baselines": [(model, 0, devices) for model in ("candle_uno", "dlrm", "mmt") for devices in (8, 32)],
    # the other branch shapes, growing: two twin towers with a merge stage, many short branches (7 + 7 in dlrm),
    # seven unequal ones (candle_uno), for graphpipe against its own chain DP
    "families": [(model, layers, 32) for model in ("two_branch", "dlrm", "candle_uno") for layers in (4, 16, 32)],
    "library": [("clip_towers", 24, 8), ("clip_towers", 24, 64)],
    # a decoder-only language model: Llama-7B's shapes with 8 and 32 layers, blocks nested in every layer
    "decoder": [("llama", 8, 64), ("llama", 32, 64)],
}
# models from outside the zoo: file spec, fixed overrides, and the override that sets the layers per branch
LIBRARY: dict[str, tuple[str, dict[str, Any], str]] = {
    "clip_towers": ("examples/clip_towers.py:factory", {"width": 1024}, "layers"),
    "llama": ("examples/llama.py:factory", {}, "layers"),
}


def one_run(graph_file: str, costs_file: str, devices: int, planner: str, granularity: str) -> dict[str, Any]:
    """The child process: one `gp.plan` call, its seconds, peak memory and plan."""
    from graphpipe.cost.cost_table import CostTable
    from graphpipe.cost.presets import cluster_preset
    from graphpipe.errors import PlanningError
    from graphpipe.graph.op_graph import OpGraph
    from graphpipe.planning import plan

    graph, costs = OpGraph.load(graph_file), CostTable.load(costs_file)
    before_kib = peak_kib()
    start = time.perf_counter()
    try:
        best = plan(graph, costs, cluster_preset("summit", devices), BATCH, planner=planner, granularity=granularity)
    except PlanningError as err:
        return {"seconds": time.perf_counter() - start, "gave_up": str(err).splitlines()[0][:160]}
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mib": peak_kib() / 1024, "loaded_mib": before_kib / 1024,
            "load_average": os.getloadavg()[0],
            "samples_per_s": best.predicted_samples_per_s, "depth": best.depth, "stages": best.num_stages,
            "micro_batch": best.stages[0].micro_batch_size, "devices_used": best.world_size}


def peak_kib() -> int:
    """This process's peak resident memory: the kernel's high-water mark of its own address space (VmHWM), which
    starts afresh at exec; `ru_maxrss` (the fallback off Linux) carries the spawning process's peak over."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))


def spawn(graph_file: Path, costs_file: Path, devices: int, planner: str, granularity: str,
          limit_s: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", str(graph_file), str(costs_file), str(devices), planner,
               granularity]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s, check=True)
    except subprocess.TimeoutExpired:
        return {"seconds": limit_s, "stopped": True}
    except subprocess.CalledProcessError as err:  # a crash is a result too: recorded, the sweep goes on
        last = (err.stderr or "").strip().splitlines()[-1:] or ["no message"]
        return {"seconds": 0.0, "gave_up": f"crashed: {last[0][:160]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def capture_to(folder: Path, model: str, layers: int) -> tuple[Path, Path, int, int]:
    """Capture the paper preset (a `LIBRARY` model: its factory) with `layers` layers per branch on meta; save
    graph and analytic costs."""
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.graph.capture import capture
    from graphpipe.graph.layers import layer_blocks
    from graphpipe.models import load_model

    spec, fixed, key = LIBRARY.get(model, (model, {}, "num_layers"))
    spec = str(HERE.parent.parent / spec) if model in LIBRARY else spec
    zoo = load_model(spec, "paper", device="meta", **fixed, **({key: layers} if layers else {}))
    graph = capture(zoo.model, zoo.inputs, name=f"{model}-{layers}")
    graph_file, costs_file = folder / f"{model}-{layers}.graph.json", folder / f"{model}-{layers}.costs.json"
    graph.save(graph_file)
    analytic_costs(graph, "v100-16gb").save(costs_file)
    return graph_file, costs_file, len(graph), len(layer_blocks(graph))


def run_sweep(name: str, planners: tuple[str, ...], granularities: tuple[str, ...], rounds: int, limit_s: float,
              folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    stopped: set[tuple[str, str, str]] = set()  # (model, planner, granularity) past the limit at a smaller size
    captured: dict[tuple[str, int], tuple[Path, Path, int, int]] = {}
    for model, layers, devices in SWEEPS[name]:
        if (model, layers) not in captured:
            captured[(model, layers)] = capture_to(folder, model, layers)
        graph_file, costs_file, ops, blocks = captured[(model, layers)]
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(rounds):
            for granularity in granularities:
                for planner in planners:
                    if (model, planner, granularity) in stopped:
                        continue
                    run = spawn(graph_file, costs_file, devices, planner, granularity, limit_s)
                    runs.setdefault((planner, granularity), []).append(run)
                    if run.get("stopped"):
                        stopped.add((model, planner, granularity))
        for (planner, granularity), done in runs.items():
            row = {"sweep": name, "model": model, "layers": layers, "ops": ops, "blocks": blocks,
                   "devices": devices, "planner": planner, "granularity": granularity, **done[-1],
                   "seconds": statistics.median(r["seconds"] for r in done), "rounds": [r["seconds"] for r in done],
                   "peak_mib": max((r.get("peak_mib", 0.0) for r in done), default=0.0)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def ratio_cell(rows: list[dict[str, Any]], over: str, under: str, granularity: str, **where: Any) -> str:
    """Median (lowest-highest) of the per-round seconds of `over` / `under` at one configuration."""
    cells = {r["planner"]: r for r in rows if r["granularity"] == granularity
             and all(r[k] == v for k, v in where.items())}
    a, b = cells.get(over), cells.get(under)
    if a is None or b is None or "samples_per_s" not in a or "samples_per_s" not in b:
        return "-"
    values = [x / y for x, y in zip(a["rounds"], b["rounds"])]
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def cell(row: dict[str, Any] | None, limit_s: float) -> str:
    if row is None:
        return "not run"
    if row.get("stopped"):
        return f"> {limit_s:.0f} s"
    if "gave_up" in row:
        return f"gave up ({row['seconds']:.1f} s)"
    return f"{row['seconds']:.2f} s"


def table(rows: list[dict[str, Any]], planners: tuple[str, ...], limit_s: float) -> str:
    """One row per configuration and granularity: each planner's median seconds, graphpipe / sequential and
    each other baseline / graphpipe (per-round ratios: median, lowest-highest), graphpipe's peak memory."""
    others = [p for p in planners if p not in ("graphpipe", "sequential")]
    ratios = [("graphpipe", "sequential")] * ("sequential" in planners) + [(p, "graphpipe") for p in others]
    head = ["model", "layers", "ops / blocks", "devices", "gran.", *planners, *(f"{a} / {b}" for a, b in ratios),
            "peak MiB (graphpipe)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---:|---|" + "---:|" * (len(planners) + len(ratios) + 1)]
    configs = sorted({(r["model"], r["layers"], r["ops"], r["blocks"], r["devices"]) for r in rows},
                     key=lambda c: (c[0], c[1], c[4]))
    for model, layers, ops, blocks, devices in configs:
        for granularity in present_granularities(rows):
            where = {"model": model, "layers": layers, "devices": devices}
            cells = {r["planner"]: r for r in rows if r["granularity"] == granularity
                     and all(r[k] == v for k, v in where.items())}
            if not cells:
                continue
            peak = cells.get("graphpipe", {}).get("peak_mib")
            lines.append(f"| {model} | {layers or 'paper'} | {ops} / {blocks} | {devices} | {granularity} | "
                         + " | ".join(cell(cells.get(p), limit_s) for p in planners) + " | "
                         + " | ".join(ratio_cell(rows, a, b, granularity, **where) for a, b in ratios) + " | "
                         + (f"{peak:.0f}" if peak else "-") + " |")
    return "\n".join(lines)


def present_granularities(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({r["granularity"] for r in rows}, key=GRANULARITIES.index)


def plot(rows: list[dict[str, Any]], planners: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = [("ops", "mmt", "ops", "ops in the graph (MMT, 4 branches, 32 devices)"),
              ("ops", "transformer", "ops", "ops in the graph (transformer chain, 32 devices)"),
              ("devices", "mmt", "devices", "devices (MMT, 4 x 32 layers)")]
    colors = dict(zip(PLANNERS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ax, (sweep, model, x_key, label) in zip(axes, panels):
        for planner in planners:
            for granularity, style in zip(GRANULARITIES, ("-", "--")):
                points = sorted((r[x_key], r["seconds"]) for r in rows
                                if r["sweep"] == sweep and r["model"] == model and r["planner"] == planner
                                and r["granularity"] == granularity and "samples_per_s" in r)
                if points:
                    ax.plot(*zip(*points), style, marker="o", color=colors[planner],
                            label=f"{planner} ({granularity})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("gp.plan seconds (median)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7) if axes[0].lines else None
    fig.suptitle("Search time: solid = op granularity, dashed = layer granularity (missing: stopped or gave up)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        graph_file, costs_file, devices, planner, granularity = sys.argv[2:7]
        print(json.dumps(one_run(graph_file, costs_file, int(devices), planner, granularity)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", choices=("ops", "devices", "both", "baselines", "families", "library", "decoder"),
                        default="both",
                        help="ops and devices (both, the default); baselines: the paper's models at 8 and 32 "
                             "devices, for graphpipe against PipeDream and Piper at layer granularity; families: "
                             "the other branch shapes (two_branch, dlrm, candle_uno) with 4-32 layers at 32 devices; "
                             "library: Hugging Face CLIP towers (examples/clip_towers.py) at 8 and 64 devices; "
                             "decoder: Llama-7B's shapes with 8 and 32 layers (examples/llama.py) at 64 devices")
    parser.add_argument("--planners", default=",".join(PLANNERS))
    parser.add_argument("--rounds", type=int, default=3, help="runs of every planner per configuration (default 3)")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds before a run is stopped (default 120)")
    parser.add_argument("--max-layers", type=int, default=None, help="leave out larger models (a quick look)")
    parser.add_argument("--max-devices", type=int, default=None, help="leave out more devices (a quick look)")
    parser.add_argument("--granularities", default=",".join(GRANULARITIES))
    parser.add_argument("--plot-only", nargs="+", metavar="RESULTS.json",
                        help="draw search_time.png from these result files and stop")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    planners = tuple(args.planners.split(","))
    granularities = tuple(args.granularities.split(","))
    if args.plot_only:
        rows = [row for name in args.plot_only for row in json.loads(Path(name).read_text())["rows"]]
        plot(rows, PLANNERS, HERE / "search_time.png")
        return
    sweeps = ("ops", "devices") if args.sweep == "both" else (args.sweep,)
    for sweep in sweeps:
        SWEEPS[sweep] = [(model, layers, devices) for model, layers, devices in SWEEPS[sweep]
                         if layers <= (args.max_layers or layers) and devices <= (args.max_devices or devices)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for sweep in sweeps:
            rows += run_sweep(sweep, planners, granularities, args.rounds, args.limit, Path(folder))
    Path(args.out).write_text(json.dumps({"batch": BATCH, "cluster": "summit", "costs": "analytic v100-16gb",
                                          "rounds": args.rounds, "limit_s": args.limit,
                                          "machine": platform.platform(), "rows": rows}, indent=1) + "\n")
    if set(sweeps) & {"ops", "devices"}:  # the picture's panels
        plot(rows, planners, Path(args.out).with_name(Path(args.out).stem.replace("results", "search_time") + ".png"))
    print(table(rows, planners, args.limit))


if __name__ == "__main__":
    main()
