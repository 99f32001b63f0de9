"""Graph pipelines for multi-branch networks the project did not write, on the simulated Summit cluster.

    .venv/bin/python benchmarks/real_models/run.py            # realistic sizes, several minutes on 2 cores
    .venv/bin/python benchmarks/real_models/run.py --quick    # tiny sizes, seconds, into a temporary folder

Two dual-encoder models from Hugging Face transformers, built from their config classes with random
weights (nothing downloaded) and captured on the meta device: CLIP's towers (ViT-B/32 vision, CLIP
text) and ALIGN's towers (EfficientNet-B7 vision, BERT-base text). Each is costed by the analytic
V100 roofline and planned at layer granularity by graphpipe and the sequential baselines at several
device counts and two mini-batches per device count; every plan is simulated (1F1B). Writes
`results.json`, one throughput plot per model, graphpipe's stage graph per model at `picture_devices`
(a PNG and the plan's JSON), and prints the tables (markdown). Planners that give up are recorded
with their reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
PLANNERS = ("graphpipe", "sequential", "pipedream", "piper")
SEQUENTIAL_PLANNERS = ("sequential", "pipedream", "piper")


# ---- the models ---------------------------------------------------------------------------------

class ClipTowers(nn.Module):
    """CLIP's text and vision towers scored pair by pair (text i with image i), as examples/clip_towers.py."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers import CLIPModel

        self.clip = CLIPModel(config)

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        text = self.clip.text_projection(self.clip.text_model(input_ids=input_ids).pooler_output)
        image = self.clip.visual_projection(self.clip.vision_model(pixel_values=pixel_values).pooler_output)
        return nn.functional.cosine_similarity(text, image, dim=-1)


class AlignTowers(nn.Module):
    """ALIGN's BERT text tower (projected [CLS]) and EfficientNet image tower (pooled), scored pair by pair."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers import AlignModel

        self.align = AlignModel(config)

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        text = self.align.text_projection(self.align.text_model(input_ids=input_ids).last_hidden_state[:, 0, :])
        image = self.align.vision_model(pixel_values=pixel_values).pooler_output
        return nn.functional.cosine_similarity(text, image, dim=-1)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A model of the benchmark: how to build it and its example inputs (sizes in `sizes`, for the record)."""

    name: str
    title: str
    build: Callable[[], nn.Module]
    seq_len: int
    vocab_size: int
    image_size: int
    sizes: dict[str, Any] = field(default_factory=dict)

    def inputs(self, batch: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        return {"input_ids": torch.randint(1, self.vocab_size, (batch, self.seq_len), generator=generator),
                "pixel_values": torch.randn(batch, 3, self.image_size, self.image_size, generator=generator)}


def clip_spec(*, quick: bool) -> ModelSpec:
    """ViT-B/32 vision tower and CLIP's text tower (openai/clip-vit-base-patch32's shapes); tiny with `quick`."""
    from transformers import CLIPConfig

    if quick:
        text = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                "vocab_size": 1000, "max_position_embeddings": 16}
        vision = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "image_size": 32, "patch_size": 8}
        projection = 64
    else:
        text = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 8,
                "vocab_size": 49408, "max_position_embeddings": 77}
        vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "image_size": 224, "patch_size": 32}
        projection = 512
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection)
    return ModelSpec(name="clip", title="CLIP towers (ViT-B/32 + text)" if not quick else "CLIP towers (tiny)",
                     build=lambda: ClipTowers(config), seq_len=text["max_position_embeddings"],
                     vocab_size=text["vocab_size"], image_size=vision["image_size"],
                     sizes={"text": text, "vision": vision, "projection_dim": projection})


def align_spec(*, quick: bool) -> ModelSpec:
    """EfficientNet-B7 (AlignVisionConfig's defaults) at 289 px and BERT-base text, 64 tokens; tiny with `quick`.

    The image tower's pooled width is its last block's channels (640 for B7), so the text projection
    must have that width for the pair score.
    """
    from transformers import AlignConfig

    if quick:
        vision = {"image_size": 32, "width_coefficient": 0.25, "depth_coefficient": 0.5}
        text = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                "vocab_size": 1000, "max_position_embeddings": 64}
        projection, seq_len = 80, 16
    else:
        vision = {"image_size": 289}  # width 2.0, depth 3.1: EfficientNet-B7's 55 blocks
        text = {}  # BERT-base: hidden 768, 12 layers, 12 heads, vocabulary 30,522
        projection, seq_len = 640, 64
    config = AlignConfig(text_config=text, vision_config=vision, projection_dim=projection)
    return ModelSpec(name="align", title="ALIGN towers (EfficientNet-B7 + BERT-base)" if not quick
                     else "ALIGN towers (tiny)", build=lambda: AlignTowers(config), seq_len=seq_len,
                     vocab_size=config.text_config.vocab_size, image_size=vision["image_size"],
                     sizes={"text": text or "AlignTextConfig defaults (BERT-base)",
                            "vision": vision, "projection_dim": projection, "sequence": seq_len})


# ---- the setup ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    """What to run: realistic sizes (`FULL`) or tiny ones for the smoke test (`QUICK`)."""

    quick: bool
    cluster: str = "summit"
    device: str = "v100-16gb"
    device_counts: tuple[int, ...] = (8, 16, 32)
    # Mini-batch = per-device x devices: the paper's 8 per device, and 32 per device (a larger, still modest one).
    batch_per_device: tuple[int, ...] = (8, 32)
    planners: tuple[str, ...] = PLANNERS
    picture_devices: int = 16
    granularity: str = "layer"
    time_limit_s: float = 120.0  # Piper and PipeDream give up after this long
    capture_batch: int = 4

    def specs(self) -> list[ModelSpec]:
        return [clip_spec(quick=self.quick), align_spec(quick=self.quick)]

    def batches(self, num_devices: int) -> list[int]:
        return [k * num_devices for k in self.batch_per_device]

    @property
    def max_batch(self) -> int:
        return max(self.device_counts) * max(self.batch_per_device)


FULL = Setup(quick=False)
QUICK = Setup(quick=True, device_counts=(2, 4), batch_per_device=(8,), picture_devices=4, time_limit_s=10.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One planner on one configuration: the simulated outcome, or why the planner gave up."""

    model: str
    num_devices: int
    global_batch_size: int
    planner: str
    status: str = "ok"  # "ok", "gave_up" (a GraphPipeError) or "error" (anything else)
    reason: str = ""
    depth: int = 0
    num_stages: int = 0
    num_ranks: int = 0
    micro_batch_sizes: tuple[int, ...] = ()
    samples_per_s: float = 0.0
    iteration_time_s: float = 0.0
    peak_memory_bytes: int = 0
    search_time_s: float = 0.0
    speedup: float = 0.0  # over the best sequential plan of the same configuration

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.model, self.num_devices, self.global_batch_size)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "micro_batch_sizes": list(self.micro_batch_sizes)}


# ---- capture and costs --------------------------------------------------------------------------

@dataclass(slots=True)
class Workload:
    """A model captured once, with its analytic costs."""

    spec: ModelSpec
    graph: Any
    costs: Any
    info: dict[str, Any]


def capture_model(spec: ModelSpec, setup: Setup) -> Workload:
    """Capture on the meta device (weights never allocated); fall back to a CPU build if that fails."""
    from graphpipe.graph.capture import capture
    from graphpipe.meta_weights import empty_weights

    start = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=[]), empty_weights():
            model = spec.build()
        graph, built_on, meta_error = capture(model, spec.inputs(setup.capture_batch)), "meta", ""
    except Exception as err:  # record why, then build real weights
        meta_error = f"{type(err).__name__}: {_first_line(err)}"
        with torch.random.fork_rng(devices=[]):
            model = spec.build()
        graph, built_on = capture(model, spec.inputs(setup.capture_batch)), "cpu"
    capture_s = time.perf_counter() - start
    costs = cost_table(graph, setup)
    info = {"title": spec.title, "sizes": spec.sizes, "built_on": built_on, "meta_error": meta_error,
            "capture": graph.capture, "capture_s": round(capture_s, 1), "params": _num_params(model),
            **graph_facts(graph), **per_sample(graph, costs)}
    return Workload(spec=spec, graph=graph, costs=costs, info=info)


def cost_table(graph: Any, setup: Setup) -> Any:
    """Analytic costs of `graph` at every power-of-two micro-batch the benchmark may use."""
    from graphpipe.cost.analytic import analytic_costs

    return analytic_costs(graph, setup.device, micro_batch_sizes=_powers_of_two(max(512, setup.max_batch)))


def graph_facts(graph: Any) -> dict[str, Any]:
    """The capture summary's numbers that say how much branch parallelism the planners can use."""
    from graphpipe.graph.summary import summarize

    summary = summarize(graph)
    return {"ops": summary.num_ops, "compute_ops": summary.num_compute_ops, "max_branches": summary.max_branches,
            "largest_block_ops": summary.largest_block_ops, "op_units": summary.num_op_units,
            "layer_units": summary.num_layer_units, "layer_blocks": dict(summary.layer_blocks)}


def per_sample(graph: Any, costs: Any) -> dict[str, float]:
    """Forward + backward ms per sample at micro-batch 32, activation MiB per sample, weight GiB (fp32)."""
    b = 32
    entries = [costs.at(op.name, b) for op in graph.ops]
    return {"ms_per_sample_b32": round(sum(e.fwd_ms + e.bwd_ms for e in entries) / b, 3),
            "act_mib_per_sample": round(sum(e.act_bytes for e in entries) / b / 2**20, 1),
            "weight_gib": round(sum(e.param_bytes for e in entries) / 2**30, 3)}


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- planning and simulating --------------------------------------------------------------------

def run_one(work: Workload, setup: Setup, num_devices: int, batch: int, planner: str) -> tuple[Run, Any]:
    """Plan with `planner`, simulate the plan, and record the outcome (or the reason it gave up)."""
    from graphpipe.cost.presets import cluster_preset
    from graphpipe.errors import GraphPipeError
    from graphpipe.planning import plan
    from graphpipe.simulation.simulator import simulate

    costs = work.costs
    base = Run(model=work.spec.name, num_devices=num_devices, global_batch_size=batch, planner=planner)
    cluster = cluster_preset(setup.cluster, num_devices)
    start = time.perf_counter()
    try:
        found = plan(work.graph, costs, cluster, batch, planner=planner, granularity=setup.granularity,
                     time_limit_s=setup.time_limit_s)
        result = simulate(found, costs, cluster, schedule="1f1b")
    except GraphPipeError as err:
        return replace(base, status="gave_up", reason=_first_line(err), search_time_s=_since(start)), None
    except Exception as err:  # a planner or simulator bug: keep going, report it
        return replace(base, status="error", reason=f"{type(err).__name__}: {_first_line(err)}",
                       search_time_s=_since(start)), None
    return replace(base, depth=found.depth, num_stages=found.num_stages, num_ranks=found.world_size,
                   micro_batch_sizes=tuple(sorted({s.micro_batch_size for s in found.stages})),
                   samples_per_s=result.samples_per_s, iteration_time_s=result.iteration_time_s,
                   peak_memory_bytes=max(result.peak_memory_bytes, default=0),
                   search_time_s=round(_since(start), 2)), found


def with_speedups(runs: Sequence[Run]) -> list[Run]:
    """Each run's throughput over the best sequential plan of its configuration (0 when there is none)."""
    best: dict[tuple[Any, ...], float] = {}
    for r in runs:
        if r.ok and r.planner in SEQUENTIAL_PLANNERS:
            best[r.key] = max(best.get(r.key, 0.0), r.samples_per_s)
    return [replace(r, speedup=r.samples_per_s / best[r.key]) if r.ok and best.get(r.key, 0.0) > 0 else r
            for r in runs]


def _since(start: float) -> float:
    return time.perf_counter() - start


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


# ---- the benchmark ------------------------------------------------------------------------------

def run_model(work: Workload, setup: Setup, out_dir: Path, progress: Callable[[Run], None]) -> list[Run]:
    """Every planner at every device count and mini-batch; graphpipe's plan at `picture_devices` drawn."""
    from graphpipe.simulation.stage_picture import render_stage_graph

    runs = []
    for n in setup.device_counts:
        for batch in setup.batches(n):
            for planner in setup.planners:
                run, found = run_one(work, setup, n, batch, planner)
                progress(run)
                runs.append(run)
                if found is not None and planner == "graphpipe" and n == setup.picture_devices \
                        and batch == setup.batches(n)[0]:
                    found.save(out_dir / f"plan_{work.spec.name}_{n}.json")
                    render_stage_graph(found, out_dir / f"stages_{work.spec.name}_{n}.png", graph=work.graph)
    return runs


def run_all(setup: Setup, out_dir: Path, progress: Callable[[Run], None] = lambda r: None) -> dict[str, Any]:
    """Run the benchmark; write results.json and the pictures into `out_dir`; return the results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    models, runs = {}, []
    for spec in setup.specs():
        work = capture_model(spec, setup)
        models[spec.name] = work.info
        runs += run_model(work, setup, out_dir, progress)
    runs = with_speedups(runs)
    plots = [plot_throughput(runs, name, models[name]["title"], setup, out_dir) for name in models]
    results = {"format": "graphpipe.real-models-benchmark/1", "setup": _setup_dict(setup), "models": models,
               "runs": [r.to_dict() for r in runs], "tables": tables(runs, models, setup),
               "plots": plots + sorted(p.name for p in out_dir.glob("stages_*.png")),
               "wall_time_s": round(_since(start), 1)}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def replot(setup: Setup, out_dir: Path) -> dict[str, Any]:
    """Re-draw the throughput plots and re-make the tables of `out_dir/results.json` (plans are not re-run)."""
    path = out_dir / "results.json"
    results = json.loads(path.read_text())
    runs = [Run(**{**r, "micro_batch_sizes": tuple(r["micro_batch_sizes"])}) for r in results["runs"]]
    for name, info in results["models"].items():
        plot_throughput(runs, name, info["title"], setup, out_dir)
    results["tables"] = tables(runs, results["models"], setup)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def _setup_dict(setup: Setup) -> dict[str, Any]:
    return {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup)}


# ---- tables and plots -----------------------------------------------------------------------------

def tables(runs: Sequence[Run], models: dict[str, dict[str, Any]], setup: Setup) -> dict[str, str]:
    return {"models": models_table(models), "throughput": throughput_table(runs, setup),
            "search": search_table(runs, setup)}


def models_table(models: dict[str, dict[str, Any]]) -> str:
    rows = ["| model | params | built on / capture | ops (computing) | layer units | branches | "
            "ms/sample fwd+bwd (b=32) | activations MiB/sample | weights GiB |", "|---|" + "---|" * 8]
    for info in models.values():
        rows.append(f"| {info['title']} | {info['params'] / 1e6:.1f} M | {info['built_on']} / {info['capture']} | "
                    f"{info['ops']} ({info['compute_ops']}) | {info['layer_units']} | {info['max_branches']} | "
                    f"{info['ms_per_sample_b32']:.2f} | {info['act_mib_per_sample']:,.0f} | {info['weight_gib']:.2f} |")
    return "\n".join(rows)


def throughput_table(runs: Sequence[Run], setup: Setup) -> str:
    header = (["model", "devices", "mini-batch"] + [f"{p} samples/s" for p in setup.planners]
              + ["graphpipe depth / mb", "best sequential depth / mb", "graphpipe / best sequential"])
    rows = ["| " + " | ".join(header) + " |", "|---|" + "---|" * (len(header) - 1)]
    for key, group in _groups(runs):
        by = {r.planner: r for r in group}
        g, seq = by.get("graphpipe"), _best_sequential(group)
        cells = [key[0], str(key[1]), str(key[2])] + [_throughput(by.get(p)) for p in setup.planners]
        cells += [_shape(g), f"{_shape(seq)} ({seq.planner})" if seq else "-",
                  f"{g.speedup:.2f}x" if g and g.speedup else "-"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def search_table(runs: Sequence[Run], setup: Setup) -> str:
    header = ["model", "devices", "mini-batch", *[f"{p} s" for p in setup.planners], "gave up (reason)"]
    rows = ["| " + " | ".join(header) + " |", "|---|" + "---|" * (len(header) - 1)]
    for key, group in _groups(runs):
        by = {r.planner: r for r in group}
        reasons = "; ".join(f"{r.planner}: {r.reason[:160]}" for r in group if not r.ok) or "-"
        cells = [key[0], str(key[1]), str(key[2])]
        cells += [f"{by[p].search_time_s:.1f}" if p in by else "-" for p in setup.planners] + [reasons]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _groups(runs: Any) -> list[tuple[tuple[Any, ...], list[Run]]]:
    grouped: dict[tuple[Any, ...], list[Run]] = {}
    for r in runs:
        grouped.setdefault(r.key, []).append(r)
    return list(grouped.items())


def _best_sequential(group: Sequence[Run]) -> Run | None:
    found = [r for r in group if r.ok and r.planner in SEQUENTIAL_PLANNERS]
    return max(found, key=lambda r: r.samples_per_s) if found else None


def _throughput(r: Run | None) -> str:
    if r is None:
        return "-"
    return f"{r.samples_per_s:,.0f}" if r.ok else r.status.replace("_", " ")


def _shape(r: Run | None) -> str:
    if r is None or not r.ok:
        return "-"
    return f"{r.depth} / {','.join(map(str, r.micro_batch_sizes))}"


def plot_throughput(runs: Sequence[Run], model: str, title: str, setup: Setup, out_dir: Path) -> str:
    """Samples/s against devices, one panel per mini-batch rule, one line per planner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    panels = setup.batch_per_device
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.5, 5.2 * len(panels)), 3.8), squeeze=False)
    for ax, per_device in zip(axes[0], panels):
        for planner in setup.planners:
            points = [(r.num_devices, r.samples_per_s) for r in runs if r.model == model and r.planner == planner
                      and r.ok and r.global_batch_size == per_device * r.num_devices]
            if points:
                ax.plot(*zip(*points), marker="o", label=planner)
        ax.set(title=f"{per_device} samples per device", xlabel="V100s (simulated Summit)", ylabel="samples/s")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(list(setup.device_counts), [str(n) for n in setup.device_counts])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: simulated 1F1B throughput, analytic V100 costs", fontsize=10)
    fig.tight_layout()
    name = f"throughput_{model}.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def _print_progress(r: Run) -> None:
    outcome = (f"{r.samples_per_s:,.0f} samples/s, depth {r.depth}, mb {list(r.micro_batch_sizes)}"
               if r.ok else f"{r.status}: {r.reason[:100]}")
    print(f"{r.model} {r.num_devices} dev batch {r.global_batch_size} {r.planner}: {outcome} "
          f"[{r.search_time_s:.1f} s]", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few configurations (seconds)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: benchmarks/real_models; with --quick a new temporary folder)")
    parser.add_argument("--replot", action="store_true",
                        help="re-draw the throughput plots and tables from the existing results.json; runs nothing")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    if args.replot:
        results = replot(setup, args.out or HERE)
        print("\n\n".join(results["tables"].values()))
        return 0
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="graphpipe-real-models-")) if args.quick else HERE)
    results = run_all(setup, out_dir, progress=_print_progress)
    print("\n\n".join(results["tables"].values()))
    print(f"\nwrote {out_dir / 'results.json'} and {len(results['plots'])} pictures in {results['wall_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
