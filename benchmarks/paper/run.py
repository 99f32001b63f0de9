"""Reproduce the paper's evaluation (docs/method.md §6) on the simulated Summit cluster.

    .venv/bin/python benchmarks/paper/run.py            # paper presets, about 30 minutes on 2 cores
    .venv/bin/python benchmarks/paper/run.py --quick    # tiny presets, seconds, into a temporary folder
    .venv/bin/python benchmarks/paper/run.py --only paper_regime,batch   # a subset of the experiments
    .venv/bin/python benchmarks/paper/run.py --tables-only   # re-write TABLES.md, HEADLINE.md from results.json

Every number is a simulated 1F1B iteration (`graphpipe.simulation`) of the plan a planner
returns (`graphpipe.planner`) for a model captured on the meta device and costed by the
analytic V100 roofline. The headline compares the planners in the paper's regime (the
largest mini-batch that still fits, found by doubling) and in a small one (8 samples per
device), all at layer granularity. Writes `results.json`, one PNG per figure, `TABLES.md`
(every table) and `HEADLINE.md` (the 32-device tables), and prints the tables (markdown).
`--tables-only` re-writes the two markdown files from an existing `results.json`. Planners that
give up are recorded with their reason, never dropped.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FORMAT = "graphpipe.paper-benchmark/2"
SEQUENTIAL_PLANNERS = ("pipedream", "piper", "sequential")  # plans whose stage graph is a chain
RULE_MAX_BATCH = 2**20  # the paper's rule gives at most 524,288 here (dlrm and candle_uno at 32 devices)
SPEEDUP_TOLERANCE = 1e-6  # relative; below this a graphpipe plan counts as slower than a sequential one
# experiment -> what its mini-batch is
REGIMES = {"paper_rule": "paper's rule", "paper_regime": "capped regime", "scaling": "small regime"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    """What to run: the paper's configuration (`FULL`) or a tiny one for the smoke test (`QUICK`)."""

    preset: str
    cluster: str = "summit"
    device: str = "v100-16gb"
    models: tuple[str, ...] = ("mmt", "dlrm", "candle_uno")
    device_counts: tuple[int, ...] = (4, 8, 16, 32)
    planners: tuple[str, ...] = ("graphpipe", "pipedream", "piper", "sequential")
    granularity: str = "layer"  # of the headline experiments (scaling, paper_regime, batch): one for every planner
    batch_per_device: int = 8  # the small regime: mini-batch = batch_per_device x devices
    # The paper's regime: the largest power of two at which the best sequential plan fits, found by doubling
    # from the small regime. The paper states no mini-batch sizes, and under graphpipe's memory model every
    # mini-batch fits (1F1B keeps at most `depth` micro-batches in flight, whatever their number), so the
    # doubling stops here: 2,048 samples per device at 32 devices, where the ratios have levelled off.
    batch_cap: int = 65_536
    sweep_batches: tuple[int, ...] = (256, 1_024, 4_096, 16_384, 65_536)  # the mini-batch sweep at ablation_devices
    piper_max_downsets: int = 40_000  # the original Piper's budget
    # Per call of piper and pipedream: a safety net. At layer granularity both plan mmt in 10-261 s per call and
    # give up on dlrm and candle_uno on their budgets (downsets, states, stages) within seconds.
    baseline_time_limit_s: float = 600.0  # a safety net: PipeDream takes 260-300 s on mmt at 32 devices here
    ablation_devices: int = 32
    branch_counts: tuple[int, ...] = (2, 4, 8, 16)
    branch_devices: int = 16  # candle_uno with 2 branches has 25 ops: too few for 32 devices
    branch_planners: tuple[str, ...] = ("graphpipe", "pipedream", "sequential")
    micro_batch_model: str = "mmt"
    micro_batch_devices: int = 8
    micro_batch_mini_batch: int = 128  # the paper's mini-batch for its micro-batch sweep of mmt at 8 GPUs
    case_devices: int = 8
    case_batch: int = 128
    case_memory_limits_gib: tuple[float | None, ...] = (None, 1.0, 0.52, 0.4, 0.38)  # None: the device's 16 GiB
    transformer_devices: tuple[int, ...] = (8, 32)

    def batch(self, num_devices: int) -> int:
        return self.batch_per_device * num_devices

    @property
    def max_batch(self) -> int:
        counts = (*self.device_counts, self.ablation_devices, self.branch_devices, self.micro_batch_devices,
                  self.case_devices, *self.transformer_devices)
        return max(max(counts) * self.batch_per_device, self.batch_cap, *self.sweep_batches, self.case_batch)

    def limits(self, planner: str) -> dict[str, Any]:
        """`PlanOptions` limits for `planner`: the baselines' budgets (graphpipe's own planners have none)."""
        if planner == "piper":
            return {"max_downsets": self.piper_max_downsets, "time_limit_s": self.baseline_time_limit_s}
        return {"time_limit_s": self.baseline_time_limit_s} if planner == "pipedream" else {}


FULL = Setup(preset="paper")
QUICK = Setup(preset="tiny", models=("mmt", "candle_uno"), device_counts=(2, 4),
              planners=("graphpipe", "pipedream", "sequential"), batch_cap=256, sweep_batches=(32, 64, 256),
              ablation_devices=4, branch_counts=(2, 4), branch_devices=4, branch_planners=("graphpipe", "sequential"),
              micro_batch_devices=4, micro_batch_mini_batch=32, case_devices=4, case_batch=32,
              case_memory_limits_gib=(None,), transformer_devices=(4,), baseline_time_limit_s=2.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One planner on one configuration: the simulated outcome, or why the planner gave up."""

    experiment: str
    model: str
    num_devices: int
    global_batch_size: int
    planner: str
    granularity: str = "op"
    options: dict[str, Any] = field(default_factory=dict)  # model overrides, fixed micro-batch, memory limit
    status: str = "ok"  # "ok", "gave_up" (a GraphPipeError) or "error" (anything else: a bug)
    reason: str = ""
    depth: int = 0
    num_stages: int = 0
    micro_batch_sizes: tuple[int, ...] = ()
    samples_per_s: float = 0.0
    iteration_time_s: float = 0.0
    predicted_samples_per_s: float = 0.0
    lower_bound_samples_per_s: float = 0.0
    peak_memory_bytes: int = 0
    memory_fraction: float = 0.0  # peak memory / the memory limit the planner was given
    search_time_s: float = 0.0
    is_sequential: bool = False  # a chain of stages (every stage on the longest path: depth == stages)
    speedup: float = 0.0  # over the best sequential plan of the same configuration

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def key(self) -> tuple[Any, ...]:
        """Runs with the same key are the same configuration, planned by different planners."""
        return (self.experiment, self.model, self.num_devices, self.global_batch_size, self.granularity,
                json.dumps(self.options, sort_keys=True))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["micro_batch_sizes"] = list(self.micro_batch_sizes)
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """One step of the doubling that finds the paper-regime mini-batch: does the best sequential plan fit?"""

    model: str
    num_devices: int
    global_batch_size: int
    fits: bool
    reason: str = ""  # why not
    depth: int = 0
    micro_batch_sizes: tuple[int, ...] = ()
    peak_memory_bytes: int = 0  # simulated, of the plan the probe found
    search_time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["micro_batch_sizes"] = list(self.micro_batch_sizes)
        return data


# ---- planning and simulating ----------------------------------------------------------------

class Workload:
    """Captured graphs and analytic costs, made once per model configuration; each configuration planned once."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.regimes: list[dict[str, Any]] = []  # how each paper-regime mini-batch was found
        self._cache: dict[str, tuple[Any, Any]] = {}
        self._runs: dict[str, Run] = {}

    def graph_and_costs(self, model: str, overrides: dict[str, Any]) -> tuple[Any, Any]:
        from graphpipe.cost.analytic import analytic_costs
        from graphpipe.graph.capture import capture
        from graphpipe.models import load_model

        key = json.dumps([model, overrides], sort_keys=True)
        if key not in self._cache:
            zoo = load_model(model, self.setup.preset, device="meta", **overrides)
            graph = capture(zoo.model, zoo.inputs)
            sizes = _powers_of_two(max(512, self.setup.max_batch, RULE_MAX_BATCH))  # costed, not extrapolated
            self._cache[key] = (graph, analytic_costs(graph, self.setup.device, micro_batch_sizes=sizes))
        return self._cache[key]

    def run(self, experiment: str, model: str, num_devices: int, batch: int, planner: str, *,
            granularity: str = "op", overrides: dict[str, Any] | None = None, micro_batch: int | None = None,
            memory_limit_gib: float | None = None) -> Run:
        """Plan with `planner`, simulate the plan, and record the outcome (or the reason it gave up).

        A configuration that another experiment already planned is not planned again (its run is
        reused under this experiment's name): the sweeps share their end points with the regimes.
        """
        options: dict[str, Any] = dict(overrides or {})
        if micro_batch is not None:
            options["micro_batch"] = micro_batch
        if memory_limit_gib is not None:
            options["memory_limit_gib"] = memory_limit_gib
        base = Run(experiment=experiment, model=model, num_devices=num_devices, global_batch_size=batch,
                   planner=planner, granularity=granularity, options=options)
        key = json.dumps([base.key[1:], planner])
        if key not in self._runs:
            self._runs[key] = self._plan_and_simulate(base, dict(overrides or {}), micro_batch, memory_limit_gib)
        return replace(self._runs[key], experiment=experiment)

    def _plan_and_simulate(self, base: Run, overrides: dict[str, Any], micro_batch: int | None,
                           memory_limit_gib: float | None) -> Run:
        from graphpipe.cost.presets import cluster_preset
        from graphpipe.errors import GraphPipeError

        graph, costs = self.graph_and_costs(base.model, overrides)
        cluster = cluster_preset(self.setup.cluster, base.num_devices)
        limit = memory_limit_gib * 2**30 if memory_limit_gib is not None else cluster.device.memory_bytes
        start = time.perf_counter()
        try:
            plan = plan_model(graph, costs, cluster, base.global_batch_size, planner=base.planner,
                              granularity=base.granularity,
                              micro_batch_sizes=None if micro_batch is None else (micro_batch,),
                              memory_limit=None if memory_limit_gib is None else limit,
                              **self.setup.limits(base.planner))
            result = simulate_plan(plan, costs, cluster)
        except GraphPipeError as err:
            return replace(base, status="gave_up", reason=_first_line(err),
                           search_time_s=time.perf_counter() - start)
        except Exception as err:  # a planner or simulator bug: keep going, report it
            return replace(base, status="error", reason=f"{type(err).__name__}: {_first_line(err)}",
                           search_time_s=time.perf_counter() - start)
        peak = max(result.peak_memory_bytes, default=0)
        return replace(base, depth=plan.depth, num_stages=plan.num_stages,
                       micro_batch_sizes=tuple(sorted({s.micro_batch_size for s in plan.stages})),
                       samples_per_s=result.samples_per_s, iteration_time_s=result.iteration_time_s,
                       predicted_samples_per_s=plan.predicted_samples_per_s,
                       lower_bound_samples_per_s=plan.lower_bound_samples_per_s,
                       peak_memory_bytes=peak, memory_fraction=peak / limit,
                       search_time_s=plan.search_time_s, is_sequential=plan.depth == plan.num_stages)

    def probe(self, model: str, num_devices: int, batch: int) -> Probe:
        """Does the sequential planner find a plan at `batch` whose simulated peak fits in device memory?

        Ranked by TPS, not by simulation: a probe only asks whether some chain fits, and the
        ranking's simulations are most of a plan call's time at large mini-batches.
        """
        from graphpipe.cost.presets import cluster_preset
        from graphpipe.errors import GraphPipeError

        graph, costs = self.graph_and_costs(model, {})
        cluster = cluster_preset(self.setup.cluster, num_devices)
        base = Probe(model=model, num_devices=num_devices, global_batch_size=batch, fits=False)
        start = time.perf_counter()
        try:
            plan = plan_model(graph, costs, cluster, batch, planner="sequential", granularity=self.setup.granularity,
                              micro_batch_sizes=None, memory_limit=None, rank_by="tps")
            peak = max(simulate_plan(plan, costs, cluster).peak_memory_bytes, default=0)
        except GraphPipeError as err:
            return replace(base, reason=_first_line(err), search_time_s=time.perf_counter() - start)
        fits = peak <= cluster.device.memory_bytes
        return replace(base, fits=fits, reason="" if fits else f"simulated peak {peak / 2**30:.2f} GiB",
                       depth=plan.depth, micro_batch_sizes=tuple(sorted({s.micro_batch_size for s in plan.stages})),
                       peak_memory_bytes=peak, search_time_s=time.perf_counter() - start)


def plan_model(graph: Any, costs: Any, cluster: Any, batch: int, *, planner: str, granularity: str,
               micro_batch_sizes: Sequence[int] | None, memory_limit: float | None, **limits: Any) -> Any:
    """`graphpipe.planner`: the planner's final choice (best simulated iteration among its candidates)."""
    from graphpipe.planning import plan

    return plan(graph, costs, cluster, batch, planner=planner, granularity=granularity,
                micro_batch_sizes=micro_batch_sizes, memory_limit=memory_limit, **limits)


def simulate_plan(plan: Any, costs: Any, cluster: Any) -> Any:
    from graphpipe.simulation.simulator import simulate

    return simulate(plan, costs, cluster, schedule="1f1b")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ---- experiments ------------------------------------------------------------------------------

Progress = Callable[[Run], None]


def scaling(work: Workload, progress: Progress) -> list[Run]:
    """The small regime: throughput vs devices for every model and planner, 8 samples per device."""
    s = work.setup
    runs = []
    for model in s.models:
        for n in s.device_counts:
            runs += [_logged(progress, work.run("scaling", model, n, s.batch(n), p, granularity=s.granularity))
                     for p in s.planners]
    return runs


def paper_regime(work: Workload, progress: Progress) -> list[Run]:
    """The paper's regime: every planner at the largest mini-batch that fits (`find_mini_batch`)."""
    s = work.setup
    runs = []
    for model in s.models:
        for n in s.device_counts:
            found = find_mini_batch(work, model, n)
            work.regimes.append(found)
            runs += [_logged(progress, work.run("paper_regime", model, n, found["global_batch_size"], p,
                                                granularity=s.granularity)) for p in s.planners]
    return runs


def paper_rule(work: Workload, progress: Progress) -> list[Run]:
    """The paper's rule: every planner at the mini-batch whose activations fit on the devices (`rule_mini_batch`)."""
    s = work.setup
    runs = []
    for model in s.models:
        for n in s.device_counts:
            batch = rule_mini_batch(work, model, n)
            runs += [_logged(progress, work.run("paper_rule", model, n, batch, p, granularity=s.granularity))
                     for p in s.planners]
    return runs


def rule_mini_batch(work: Workload, model: str, num_devices: int) -> int:
    """The largest power of two whose activations, spread evenly over the devices, fit in their memory:
    n x device memory / activation bytes of one sample (the analytic costs at one sample: every activation an op
    keeps for its backward). For mmt at 8 V100s of 16 GiB, 640 MiB a sample, that is 128, as the paper states."""
    from graphpipe.cost.presets import cluster_preset

    graph, costs = work.graph_and_costs(model, {})
    per_sample = sum(costs.at(op, 1).act_bytes for op in graph.names)
    memory = cluster_preset(work.setup.cluster, num_devices).device.memory_bytes
    fitting = max(1, num_devices * memory // max(per_sample, 1))
    return 1 << (int(fitting).bit_length() - 1)


def find_mini_batch(work: Workload, model: str, num_devices: int) -> dict[str, Any]:
    """The paper's rule: double the small regime's mini-batch while the best sequential plan fits, up to the cap.

    If not even the small regime's mini-batch fits, the rule has no answer and that one is kept.
    """
    s = work.setup
    batch, probes = s.batch(num_devices), []
    while True:
        probes.append(work.probe(model, num_devices, batch))
        _print_probe(probes[-1])
        if not probes[-1].fits or batch * 2 > s.batch_cap:
            break
        batch *= 2
    fitting = [p for p in probes if p.fits]
    last = probes[-1]
    stopped = (f"the cap ({s.batch_cap:,})" if last.fits else
               f"{last.global_batch_size:,} does not fit ({last.reason})")
    return {"model": model, "num_devices": num_devices,
            "global_batch_size": fitting[-1].global_batch_size if fitting else s.batch(num_devices),
            "stopped_by": stopped, "probe_time_s": sum(p.search_time_s for p in probes),
            "probes": [p.to_dict() for p in probes]}


def op_level(work: Workload, progress: Progress) -> list[Run]:
    """The small regime at the largest device count at op granularity, to set beside the layer-level one."""
    s = work.setup
    n = max(s.device_counts)
    return [_logged(progress, work.run("op_level", model, n, s.batch(n), p, granularity="op"))
            for model in s.models for p in s.planners]


def batch_sweep(work: Workload, progress: Progress) -> list[Run]:
    """How the ratio depends on the mini-batch: every planner at several mini-batches at one device count."""
    s = work.setup
    n = s.ablation_devices
    return [_logged(progress, work.run("batch", model, n, b, p, granularity=s.granularity))
            for model in s.models for b in s.sweep_batches for p in s.planners]


def ablation(work: Workload, progress: Progress) -> list[Run]:
    """Sequential vs parallel-only (graph stages, sequential's micro-batch) vs graphpipe.

    Parallel-only is run twice: the library's `parallel-only` planner, and graphpipe held to
    the micro-batch of the sequential plan this benchmark simulated (the paper's definition).
    """
    s = work.setup
    n = s.ablation_devices
    runs = []
    for model in s.models:
        group = [_logged(progress, work.run("ablation", model, n, s.batch(n), p))
                 for p in ("sequential", "parallel-only", "graphpipe")]
        seq = group[0]
        if seq.ok:
            group.append(_logged(progress, work.run("ablation", model, n, s.batch(n), "graphpipe",
                                                    micro_batch=seq.micro_batch_sizes[0])))
        runs += group
    return runs


def branch_sweep(work: Workload, progress: Progress) -> list[Run]:
    """candle_uno with more and more branches on a fixed number of devices."""
    return _branch_runs(work, progress, "branches", lambda _: work.setup.branch_devices)


def branch_pairs(work: Workload, progress: Progress) -> list[Run]:
    """candle_uno with k branches on k devices, the paper's pairing, 8 samples per device."""
    return _branch_runs(work, progress, "branches_paired", lambda k: k)


def _branch_runs(work: Workload, progress: Progress, experiment: str, devices: Callable[[int], int]) -> list[Run]:
    s = work.setup
    return [_logged(progress, work.run(experiment, "candle_uno", devices(k), s.batch(devices(k)), p,
                                       overrides={"num_branches": k}))
            for k in s.branch_counts for p in s.branch_planners]


def micro_batch_sweep(work: Workload, progress: Progress) -> list[Run]:
    """One fixed micro-batch size per run, for graphpipe and sequential, at the paper's mini-batch (128)."""
    s = work.setup
    n = s.micro_batch_devices
    batch = s.micro_batch_mini_batch
    sizes = _powers_of_two(batch)
    return [_logged(progress, work.run("micro_batch", s.micro_batch_model, n, batch, p, micro_batch=b))
            for b in sizes for p in ("graphpipe", "sequential")]


def case_study(work: Workload, progress: Progress) -> list[Run]:
    """two_branch on a few devices, at the device's memory and at tighter memory limits."""
    s = work.setup
    n = s.case_devices
    return [_logged(progress, work.run("case_study", "two_branch", n, s.case_batch, p, memory_limit_gib=limit))
            for limit in s.case_memory_limits_gib for p in ("graphpipe", "sequential")]


def sequential_model(work: Workload, progress: Progress) -> list[Run]:
    """A chain model: graphpipe must find the sequential optimum, never worse."""
    s = work.setup
    return [_logged(progress, work.run("transformer", "transformer", n, s.batch(n), p))
            for n in s.transformer_devices for p in ("graphpipe", "sequential")]


# The headline experiments (scaling, paper_regime, batch) run at `Setup.granularity`, op_level at op level; the
# others at op level (the planners' default), where the case study's cuts inside a layer are possible.
EXPERIMENTS: dict[str, Callable[[Workload, Progress], list[Run]]] = {
    "paper_rule": paper_rule, "scaling": scaling, "paper_regime": paper_regime, "op_level": op_level,
    "batch": batch_sweep, "ablation": ablation, "branches": branch_sweep, "micro_batch": micro_batch_sweep,
    "case_study": case_study, "transformer": sequential_model, "branches_paired": branch_pairs,
}


def _powers_of_two(limit: int) -> list[int]:
    sizes, size = [], 1
    while size <= limit:
        sizes.append(size)
        size *= 2
    return sizes


def _logged(progress: Progress, run: Run) -> Run:
    progress(run)
    return run


# ---- derived numbers ------------------------------------------------------------------------

def is_baseline(r: Run) -> bool:
    """A successful run of a sequential (chain-of-stages) planner."""
    return r.ok and r.planner in SEQUENTIAL_PLANNERS


def with_speedups(runs: Iterable[Run]) -> list[Run]:
    """Each run's throughput over the best sequential plan of its configuration (0 when there is none)."""
    runs = list(runs)
    best: dict[tuple[Any, ...], float] = {}
    for r in runs:
        if is_baseline(r):
            best[r.key] = max(best.get(r.key, 0.0), r.samples_per_s)
    return [replace(r, speedup=r.samples_per_s / best[r.key]) if r.ok and best.get(r.key, 0.0) > 0 else r
            for r in runs]


def violations(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """Configurations where graphpipe is slower than a sequential plan of the same configuration."""
    out = []
    runs = list(runs)
    for g in (r for r in runs if r.planner == "graphpipe" and r.ok):
        for other in runs:
            if (other.key == g.key and is_baseline(other)
                    and g.samples_per_s < other.samples_per_s * (1 - SPEEDUP_TOLERANCE)):
                out.append({"experiment": g.experiment, "model": g.model, "num_devices": g.num_devices,
                            "global_batch_size": g.global_batch_size, "options": g.options,
                            "graphpipe_samples_per_s": g.samples_per_s, "sequential_planner": other.planner,
                            "sequential_samples_per_s": other.samples_per_s,
                            "ratio": g.samples_per_s / other.samples_per_s})
    return out


def failures(runs: Iterable[Run]) -> list[Run]:
    """graphpipe runs that gave up or crashed (it must always find a plan where a sequential planner does)."""
    return [r for r in runs if r.status == "error" or (r.planner == "graphpipe" and not r.ok)]


# ---- tables -----------------------------------------------------------------------------------

def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _tput(r: Run | None) -> str:
    if r is None:
        return "-"
    if not r.ok:
        return "gave up" if r.status == "gave_up" else "error"
    return f"{r.samples_per_s:,.0f}"


def _find(runs: Sequence[Run], **where: Any) -> Run | None:
    for r in runs:
        if all((r.options.get(k[7:]) if k.startswith("option_") else getattr(r, k)) == v
               for k, v in where.items()):
            return r
    return None


def _mb(r: Run | None) -> str:
    return "/".join(map(str, r.micro_batch_sizes)) if r is not None and r.ok else "-"


def _depth(r: Run | None) -> str:
    return str(r.depth) if r is not None and r.ok else "-"


def scaling_table(runs: Sequence[Run], setup: Setup, experiment: str = "scaling") -> str:
    planners = setup.planners
    header = ["model", "devices", "mini-batch", *[f"{p} samples/s" for p in planners], "graphpipe depth / mb",
              "best sequential depth / mb", "graphpipe / best sequential"]
    rows = []
    for model, n, group in _groups(runs, setup, experiment):
        gp, seq = _find(group, planner="graphpipe"), _best_sequential(group)
        rows.append([model, str(n), _batch_of(group), *[_tput(_find(group, planner=p)) for p in planners],
                     f"{_depth(gp)} / {_mb(gp)}",
                     f"{_depth(seq)} / {_mb(seq)} ({seq.planner})" if seq else "-", _speedup(gp)])
    return markdown(header, rows)


def paper_regime_table(runs: Sequence[Run], setup: Setup) -> str:
    return scaling_table(runs, setup, "paper_regime")


def paper_rule_table(runs: Sequence[Run], setup: Setup) -> str:
    return scaling_table(runs, setup, "paper_rule")


def _groups(runs: Sequence[Run], setup: Setup, experiment: str) -> list[tuple[str, int, list[Run]]]:
    """(model, devices, runs) of one experiment over the models and device counts, in the setup's order."""
    out = []
    for model in setup.models:
        for n in setup.device_counts:
            group = [r for r in runs if r.experiment == experiment and r.model == model and r.num_devices == n]
            if group:
                out.append((model, n, group))
    return out


def _batch_of(group: Sequence[Run]) -> str:
    return f"{group[0].global_batch_size:,}" if group else "-"


def _best_sequential(group: Sequence[Run]) -> Run | None:
    seq = [r for r in group if is_baseline(r)]
    return max(seq, key=lambda r: r.samples_per_s) if seq else None


def _speedup(r: Run | None) -> str:
    return f"{r.speedup:.2f}x" if r is not None and r.ok and r.speedup else "-"


def search_table(runs: Sequence[Run], setup: Setup) -> str:
    header = ["regime", "model", "devices", "mini-batch", *[f"{p} s" for p in setup.planners], "gave up (reason)"]
    rows = []
    for experiment, regime in REGIMES.items():
        for model, n, group in _groups(runs, setup, experiment):
            cells = []
            for p in setup.planners:
                r = _find(group, planner=p)
                cells.append("-" if r is None else f"{r.search_time_s:.2f}" + ("" if r.ok else " (gave up)"))
            reasons = "; ".join(f"{r.planner}: {_gist(r.planner, r.reason)}" for r in group if not r.ok)
            rows.append([regime, model, str(n), _batch_of(group), *cells, reasons])
    return markdown(header, rows)


def _gist(planner: str, reason: str) -> str:
    """A give-up message up to its first clause (what was counted against which budget), without the planner's
    own prefix."""
    text = reason.removeprefix(f"{planner}: ").split(";")[0]
    return _short(text, 140)


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def memory_table(runs: Sequence[Run], setup: Setup) -> str:
    header = ["regime", "model", "devices", "mini-batch", *[f"{p} peak GiB (mb)" for p in setup.planners]]
    rows = []
    for experiment, regime in REGIMES.items():
        for model, n, group in _groups(runs, setup, experiment):
            cells = [_find(group, planner=p) for p in setup.planners]
            rows.append([regime, model, str(n), _batch_of(group),
                         *[f"{r.peak_memory_bytes / 2**30:.2f} ({_mb(r)})" if r and r.ok else "-" for r in cells]])
    return markdown(header, rows)


def regime_table(runs: Sequence[Run], setup: Setup, regimes: Sequence[dict[str, Any]]) -> str:
    """How each paper-regime mini-batch was found: the probes of the sequential planner and where they stopped."""
    header = ["model", "devices", "probed (sequential planner, ranked by TPS)", "mini-batch", "stopped by",
              "sequential peak GiB at it (depth/mb)", "probe time s"]
    rows = []
    for found in regimes:
        probes = found["probes"]
        last = next((p for p in reversed(probes) if p["global_batch_size"] == found["global_batch_size"]), None)
        at = (f"{last['peak_memory_bytes'] / 2**30:.2f} ({last['depth']}/"
              f"{'/'.join(map(str, last['micro_batch_sizes']))})" if last and last["fits"] else "-")
        rows.append([found["model"], str(found["num_devices"]),
                     f"{probes[0]['global_batch_size']:,} ... {probes[-1]['global_batch_size']:,} ({len(probes)})",
                     f"{found['global_batch_size']:,}", found["stopped_by"], at, f"{found['probe_time_s']:.1f}"])
    return markdown(header, rows)


def op_level_table(runs: Sequence[Run], setup: Setup) -> str:
    """The small regime at the largest device count: layer granularity (the headline's) beside op granularity."""
    n = max(setup.device_counts)
    header = ["model", "devices", "mini-batch", "granularity", *[f"{p} samples/s" for p in setup.planners],
              "graphpipe depth / mb", "best sequential depth / mb", "graphpipe / best sequential"]
    rows = []
    for model in setup.models:
        for experiment in ("scaling", "op_level"):
            group = [r for r in runs if r.experiment == experiment and r.model == model and r.num_devices == n]
            if not group:
                continue
            gp, seq = _find(group, planner="graphpipe"), _best_sequential(group)
            rows.append([model, str(n), _batch_of(group), group[0].granularity,
                         *[_tput(_find(group, planner=p)) for p in setup.planners], f"{_depth(gp)} / {_mb(gp)}",
                         f"{_depth(seq)} / {_mb(seq)} ({seq.planner})" if seq else "-", _speedup(gp)])
    return markdown(header, rows)


def ablation_table(runs: Sequence[Run], setup: Setup) -> str:
    header = ["model", "devices", "sequential samples/s (depth/mb)", "parallel-only planner (depth/mb)",
              "graphpipe at sequential's mb (depth/mb)", "graphpipe (depth/mb)", "parallel-only / sequential",
              "graphpipe at sequential's mb / sequential", "graphpipe / sequential"]
    rows = []
    for model in setup.models:
        group = [r for r in runs if r.experiment == "ablation" and r.model == model]
        seq = _find(group, planner="sequential")
        cells = [seq, _find(group, planner="parallel-only"), _fixed_mb(group), _find(group, planner="graphpipe",
                                                                                      options={})]
        rows.append([model, str(setup.ablation_devices), *[f"{_tput(r)} ({_depth(r)}/{_mb(r)})" for r in cells],
                     *[_ratio(r, seq) for r in cells[1:]]])
    return markdown(header, rows)


def _fixed_mb(group: Sequence[Run]) -> Run | None:
    return next((r for r in group if r.planner == "graphpipe" and "micro_batch" in r.options), None)


def batch_table(runs: Sequence[Run], setup: Setup) -> str:
    n = setup.ablation_devices
    header = ["model", "devices", "mini-batch", *[f"{p} samples/s" for p in setup.planners],
              "graphpipe depth / mb", "best sequential depth / mb", "best sequential peak GiB",
              "graphpipe / best sequential"]
    rows = []
    for model in setup.models:
        for b in setup.sweep_batches:
            group = [r for r in runs if r.experiment == "batch" and r.model == model and r.global_batch_size == b]
            if not group:
                continue
            gp, seq = _find(group, planner="graphpipe"), _best_sequential(group)
            rows.append([model, str(n), f"{b:,}", *[_tput(_find(group, planner=p)) for p in setup.planners],
                         f"{_depth(gp)} / {_mb(gp)}", f"{_depth(seq)} / {_mb(seq)} ({seq.planner})" if seq else "-",
                         _gib(seq).replace(" GiB", ""), _speedup(gp)])
    return markdown(header, rows)


def _ratio(a: Run | None, b: Run | None) -> str:
    if a is None or b is None or not (a.ok and b.ok) or b.samples_per_s <= 0:
        return "-"
    return f"{a.samples_per_s / b.samples_per_s:.2f}x"


def branch_table(runs: Sequence[Run], setup: Setup, experiment: str = "branches") -> str:
    planners = setup.branch_planners
    header = ["branches", "devices", "mini-batch", *[f"{p} samples/s" for p in planners], "graphpipe depth / mb",
              "best sequential depth / mb", "speedup"]
    rows = []
    for k in setup.branch_counts:
        group = [r for r in runs if r.experiment == experiment and r.options.get("num_branches") == k]
        if not group:
            continue
        gp = _find(group, planner="graphpipe")
        seq = _best_sequential(group)
        rows.append([str(k), str(group[0].num_devices), _batch_of(group),
                     *[_tput(_find(group, planner=p)) for p in planners],
                     f"{_depth(gp)} / {_mb(gp)}", f"{_depth(seq)} / {_mb(seq)}", _speedup(gp)])
    return markdown(header, rows)


def branch_paired_table(runs: Sequence[Run], setup: Setup) -> str:
    return branch_table(runs, setup, "branches_paired")


def micro_batch_table(runs: Sequence[Run], setup: Setup) -> str:
    header = ["micro-batch", "graphpipe samples/s", "graphpipe depth", "graphpipe peak memory",
              "sequential samples/s", "sequential depth", "sequential peak memory", "graphpipe / sequential"]
    rows = []
    group = [r for r in runs if r.experiment == "micro_batch"]
    for b in sorted({r.options["micro_batch"] for r in group}):
        gp = _find(group, planner="graphpipe", option_micro_batch=b)
        seq = _find(group, planner="sequential", option_micro_batch=b)
        rows.append([str(b), _tput(gp), _depth(gp), _gib(gp), _tput(seq), _depth(seq), _gib(seq), _ratio(gp, seq)])
    return markdown(header, rows)


def _gib(r: Run | None) -> str:
    return f"{r.peak_memory_bytes / 2**30:.2f} GiB" if r is not None and r.ok else "-"


def case_table(runs: Sequence[Run], setup: Setup) -> str:
    header = ["memory limit", "planner", "stages", "depth", "micro-batch", "samples/s", "peak memory",
              "graphpipe / sequential"]
    rows = []
    group = [r for r in runs if r.experiment == "case_study"]
    for limit in setup.case_memory_limits_gib:
        pair = [r for r in group if r.options.get("memory_limit_gib") == limit]
        gp, seq = _find(pair, planner="graphpipe"), _find(pair, planner="sequential")
        label = "16 GiB (device)" if limit is None else f"{limit:g} GiB"
        for r in (seq, gp):
            if r is None:
                continue
            rows.append([label, r.planner, str(r.num_stages) if r.ok else "-", _depth(r), _mb(r), _tput(r),
                         _gib(r), _ratio(gp, seq) if r is gp else ""])
    return markdown(header, rows)


def transformer_table(runs: Sequence[Run], setup: Setup) -> str:
    header = ["devices", "batch", "graphpipe samples/s (depth/mb)", "sequential samples/s (depth/mb)",
              "graphpipe / sequential"]
    rows = []
    for n in setup.transformer_devices:
        group = [r for r in runs if r.experiment == "transformer" and r.num_devices == n]
        gp, seq = _find(group, planner="graphpipe"), _find(group, planner="sequential")
        rows.append([str(n), str(setup.batch(n)), f"{_tput(gp)} ({_depth(gp)}/{_mb(gp)})",
                     f"{_tput(seq)} ({_depth(seq)}/{_mb(seq)})", _ratio(gp, seq)])
    return markdown(header, rows)


RUNTIME_RESULTS = ("benchmarks/runtime/results/runtime.json", "benchmarks/runtime/results.json")


def runtime_table(root: Path) -> str:
    """The measured runs of `benchmarks/runtime/` with their prediction error, or a note that they are pending."""
    path = next((root / p for p in RUNTIME_RESULTS if (root / p).exists()), None)
    if path is None:
        return f"(pending: none of {', '.join(RUNTIME_RESULTS)} exists yet)"
    data = json.loads(path.read_text())
    header = ["model", "variant", "depth", "measured samples/s (median, min-max)", "measured iteration s",
              "simulated iteration s", "prediction error"]
    rows = []
    for model in data.get("models", []):
        plans = model.get("plans", {})
        for name, v in model.get("variants", {}).items():
            rows.append([str(model.get("model")), name, str(plans.get(name, {}).get("depth", "-")),
                         f"{_num(v.get('samples_per_s_median'))} ({_num(v.get('samples_per_s_min'))}-"
                         f"{_num(v.get('samples_per_s_max'))})",
                         _num(v.get("iteration_s_median"), ".3f"), _num(v.get("simulated_iteration_s"), ".3f"),
                         _num(v.get("prediction_error"), "+.0%")])
    if not rows:
        return f"(see {path.relative_to(root)}; it holds no measured variants)"
    return f"From `{path.relative_to(root)}`:\n\n" + markdown(header, rows)


def _num(value: Any, spec: str = ",.0f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


TABLES: dict[str, tuple[str, Callable[[Sequence[Run], Setup], str]]] = {
    "paper_rule": ("Paper's rule: throughput vs devices at the largest power-of-two mini-batch whose activations fit "
                   "on the devices ({granularity} granularity; samples/s, simulated)", paper_rule_table),
    "paper_regime": ("Capped regime: throughput vs devices at the largest mini-batch that fits, at most {cap:,} "
                     "({granularity} granularity; samples/s, simulated)", paper_regime_table),
    "scaling": ("Small regime: throughput vs devices at {per_device} samples per device ({granularity} granularity; "
                "samples/s, simulated)", scaling_table),
    "op_level": ("Small regime at {devices} devices: {granularity} granularity and op granularity", op_level_table),
    "batch": ("Mini-batch sweep at {sweep_devices} devices ({granularity} granularity)", batch_table),
    "search": ("Search time (seconds on this machine)", search_table),
    "memory": ("Peak memory per device of the chosen plans (of 16 GiB)", memory_table),
    "ablation": ("Ablation (op granularity)", ablation_table),
    "branches": ("Branch sweep: candle_uno on a fixed number of devices (op granularity)", branch_table),
    "branches_paired": ("Branch sweep at the paper's pairing: candle_uno with k branches on k devices "
                        "(op granularity)", branch_paired_table),
    "micro_batch": ("Micro-batch sweep: mmt at the paper's mini-batch of 128 (op granularity)", micro_batch_table),
    "case_study": ("Case study: two_branch (op granularity)", case_table),
    "transformer": ("Sequential transformer (op granularity)", transformer_table),
}
REGIME_TITLE = "How the paper-regime mini-batch was found (doubling from the small regime)"


def render_tables(runs: Sequence[Run], setup: Setup, regimes: Sequence[dict[str, Any]] = ()) -> dict[str, str]:
    """Every table as markdown under a `###` title, the probe table right after the paper-regime one."""
    fields = {"cap": setup.batch_cap, "granularity": setup.granularity, "per_device": setup.batch_per_device,
              "devices": max(setup.device_counts), "sweep_devices": setup.ablation_devices}
    out = {}
    for name, (title, fn) in TABLES.items():
        out[name] = f"### {title.format(**fields)}\n\n{fn(runs, setup)}"
        if name == "paper_regime":
            out["regime"] = f"### {REGIME_TITLE}\n\n{regime_table(runs, setup, regimes)}"
    return out


# ---- plots ------------------------------------------------------------------------------------

def plot_all(runs: Sequence[Run], setup: Setup, out_dir: Path) -> list[Path]:
    """One PNG per figure; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    paths = [plot_scaling(runs, setup, model, out_dir / f"throughput_{model}.png") for model in setup.models]
    paths.append(plot_ratio_vs_mini_batch(runs, setup, out_dir / "ratio_vs_mini_batch.png"))
    paths.append(plot_branches(runs, setup, out_dir / "branch_sweep.png"))
    paths.append(plot_micro_batch(runs, setup, out_dir / "micro_batch_sweep.png"))
    paths.append(plot_ablation(runs, setup, out_dir / "ablation.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _log2_x(ax: Any, ticks: Sequence[int]) -> None:
    """Powers of two evenly spaced, labelled as numbers (linear when nothing was plotted)."""
    if any(len(line.get_xdata()) for line in ax.get_lines()):
        ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(list(ticks), [str(t) for t in ticks])


def plot_scaling(runs: Sequence[Run], setup: Setup, model: str, path: Path) -> Path:
    """samples/s vs devices per planner: the capped regime solid, the small regime dashed, in one colour each."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, planner in enumerate(setup.planners):
        for experiment, style in (("paper_regime", "-"), ("scaling", "--")):
            points = [(r.num_devices, r.samples_per_s) for r in runs
                      if r.experiment == experiment and r.model == model and r.planner == planner and r.ok]
            label = f"{planner}, {REGIMES[experiment]}" + ("" if points else " (gave up)")
            ax.plot(*(zip(*points) if points else ([], [])), style, color=f"C{i}", marker="o", label=label)
    _log2_x(ax, setup.device_counts)
    batches = sorted({r.global_batch_size for r in runs if r.experiment == "paper_regime" and r.model == model})
    ax.set_xlabel(f"devices ({setup.cluster}); mini-batch: capped regime {'/'.join(f'{b:,}' for b in batches)}, "
                  f"small regime {setup.batch_per_device} x devices", fontsize=8)
    ax.set_ylabel("samples/s (simulated)")
    ax.set_yscale("log")
    ax.set_title(f"{model} ({setup.preset} preset, {setup.granularity} granularity)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_ratio_vs_mini_batch(runs: Sequence[Run], setup: Setup, path: Path) -> Path:
    """graphpipe / best sequential against the mini-batch at the sweep's device count, one line per model."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for model in setup.models:
        points = sorted((r.global_batch_size, r.speedup) for r in runs if r.experiment == "batch"
                        and r.model == model and r.planner == "graphpipe" and r.ok and r.speedup)
        ax.plot(*(zip(*points) if points else ([], [])), marker="o", label=model)
    ax.axhline(1.0, color="grey", linewidth=1)
    _log2_x(ax, setup.sweep_batches)
    ax.set_xlabel(f"mini-batch ({setup.ablation_devices} devices, {setup.granularity} granularity)")
    ax.set_ylabel("graphpipe / best sequential")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_branches(runs: Sequence[Run], setup: Setup, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    group = [r for r in runs if r.experiment == "branches" and r.planner == "graphpipe" and r.ok and r.speedup]
    ax.plot([r.options["num_branches"] for r in group], [r.speedup for r in group], marker="o",
            label="graphpipe / best sequential")
    ax.axhline(1.0, color="grey", linewidth=1)
    _log2_x(ax, setup.branch_counts)
    ax.set_xlabel(f"branches of candle_uno ({setup.branch_devices} devices)")
    ax.set_ylabel("speedup")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_micro_batch(runs: Sequence[Run], setup: Setup, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for planner in ("graphpipe", "sequential"):
        points = [(r.options["micro_batch"], r.samples_per_s) for r in runs
                  if r.experiment == "micro_batch" and r.planner == planner and r.ok]
        if points:
            ax.plot(*zip(*sorted(points)), marker="o", label=planner)
    _log2_x(ax, sorted({r.options["micro_batch"] for r in runs if r.experiment == "micro_batch"}))
    ax.set_xlabel(f"micro-batch size (fixed), {setup.micro_batch_model}, {setup.micro_batch_devices} devices")
    ax.set_ylabel("samples/s (simulated)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_ablation(runs: Sequence[Run], setup: Setup, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bars: dict[str, Callable[[Sequence[Run]], Run | None]] = {
        "sequential": lambda g: _find(g, planner="sequential"),
        "parallel-only planner": lambda g: _find(g, planner="parallel-only"),
        "graphpipe at sequential's mb": _fixed_mb,
        "graphpipe": lambda g: _find(g, planner="graphpipe", options={}),
    }
    width = 0.8 / len(bars)
    for i, (label, pick) in enumerate(bars.items()):
        values = []
        for model in setup.models:
            group = [r for r in runs if r.experiment == "ablation" and r.model == model]
            r, seq = pick(group), _find(group, planner="sequential")
            ok = r is not None and seq is not None and r.ok and seq.ok and seq.samples_per_s > 0
            values.append(r.samples_per_s / seq.samples_per_s if ok and r and seq else 0.0)
        ax.bar([m + i * width for m in range(len(setup.models))], values, width, label=label)
    ax.set_xticks([m + 1.5 * width for m in range(len(setup.models))], list(setup.models))
    ax.set_ylabel(f"throughput / sequential ({setup.ablation_devices} devices)")
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.legend(fontsize=8)
    return _save(fig, path)


# ---- the cost model's view of each model ---------------------------------------------------------

SUMMARY_MICRO_BATCHES = (1, 8, 64, 256)


def cost_summary(work: Workload) -> list[dict[str, Any]]:
    """Per model: one device's forward+backward time per sample at a few micro-batch sizes, memory per sample.

    This is what the planners see: how much a larger micro-batch speeds a sample up, and how
    much memory a sample's activations and the weights take.
    """
    out = []
    for model in (*work.setup.models, "two_branch", "transformer"):
        graph, costs = work.graph_and_costs(model, {})
        per_sample = {}
        for b in SUMMARY_MICRO_BATCHES:
            total_ms = sum(costs.at(op.name, b).fwd_ms + costs.at(op.name, b).bwd_ms for op in graph.ops)
            per_sample[str(b)] = total_ms / b
        act = sum(costs.at(op.name, 1).act_bytes for op in graph.ops)
        params = sum(costs.at(op.name, 1).param_bytes for op in graph.ops)
        out.append({"model": model, "num_ops": len(graph), "ms_per_sample": per_sample,
                    "act_bytes_per_sample": act, "param_bytes": params})
    return out


def cost_table(summary: Sequence[dict[str, Any]]) -> str:
    header = ["model", "ops", *[f"ms/sample at b={b}" for b in SUMMARY_MICRO_BATCHES],
              f"speed-up b={SUMMARY_MICRO_BATCHES[-1]} vs b=1", "activations MiB/sample", "weights GiB"]
    rows = []
    for m in summary:
        ms = m["ms_per_sample"]
        first, last = ms[str(SUMMARY_MICRO_BATCHES[0])], ms[str(SUMMARY_MICRO_BATCHES[-1])]
        rows.append([m["model"], str(m["num_ops"]), *[f"{ms[str(b)]:.3f}" for b in SUMMARY_MICRO_BATCHES],
                     f"{first / last:.1f}x", f"{m['act_bytes_per_sample'] / 2**20:.1f}",
                     f"{m['param_bytes'] / 2**30:.2f}"])
    return "### One V100 (analytic): forward + backward per sample, memory per sample\n\n" + markdown(header, rows)


# ---- the whole run ----------------------------------------------------------------------------

def run_all(setup: Setup, out_dir: Path, *, experiments: Sequence[str] | None = None,
            progress: Progress | None = None, plots: bool = True) -> dict[str, Any]:
    """Run the experiments, write `results.json` (and the plots) into `out_dir`, return the results."""
    from graphpipe.serde import write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    work = Workload(setup)
    start = time.perf_counter()
    runs: list[Run] = []
    for name in experiments or tuple(EXPERIMENTS):
        runs += EXPERIMENTS[name](work, progress or (lambda r: None))
    runs = with_speedups(runs)
    tables = render_tables(runs, setup, work.regimes)
    summary = cost_summary(work)
    tables["costs"] = cost_table(summary)
    results = {"format": FORMAT, "setup": _setup_dict(setup),
               "wall_time_s": time.perf_counter() - start, "runs": [r.to_dict() for r in runs],
               "regimes": work.regimes, "violations": violations(runs),
               "failures": [r.to_dict() for r in failures(runs)],
               "headline": headline(runs, setup), "cost_summary": summary, "tables": tables}
    if plots:
        results["plots"] = [p.name for p in plot_all(runs, setup, out_dir)]
    write_json_atomic(out_dir / "results.json", results)
    write_reports(results, out_dir)
    return results


def headline(runs: Sequence[Run], setup: Setup) -> dict[str, Any]:
    """Per regime and model at the largest device count: every planner's outcome and graphpipe's ratio."""
    n = max(setup.device_counts)
    out: dict[str, Any] = {"num_devices": n}
    for experiment in REGIMES:
        rows = []
        for model in setup.models:
            group = [r for r in runs if r.experiment == experiment and r.model == model and r.num_devices == n]
            if not group:
                continue
            gp, seq = _find(group, planner="graphpipe"), _best_sequential(group)
            rows.append({"model": model, "global_batch_size": group[0].global_batch_size,
                         "samples_per_s": {r.planner: (r.samples_per_s if r.ok else None) for r in group},
                         "depth": {r.planner: r.depth for r in group if r.ok},
                         "best_sequential": seq.planner if seq else None,
                         "speedup": gp.speedup if gp is not None and gp.ok and gp.speedup else None})
        out[experiment] = rows
    return out


# ---- generated markdown: TABLES.md and HEADLINE.md ---------------------------------------------

REGENERATE = ".venv/bin/python benchmarks/paper/run.py"
PAPER_SPEEDUP = "up to 1.6x"  # docs/method.md §6: graphpipe over PipeDream and Piper


def write_reports(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write `TABLES.md` and `HEADLINE.md` from a results dict, so that no number is pasted by hand."""
    paths = [out_dir / "TABLES.md", out_dir / "HEADLINE.md"]
    paths[0].write_text(tables_markdown(results))
    paths[1].write_text(headline_markdown(results))
    return paths


def rerender(out_dir: Path) -> list[Path]:
    """Re-write `TABLES.md` and `HEADLINE.md` (and the tables stored in `results.json`) from an existing
    `results.json`, without rerunning anything: the tables are rendered again from the stored runs (so a
    change to how they are drawn applies); the cost table is kept."""
    results = json.loads((out_dir / "results.json").read_text())
    runs = [Run(**{**r, "micro_batch_sizes": tuple(r["micro_batch_sizes"])}) for r in results["runs"]]
    setup = Setup(**{k: tuple(v) if isinstance(v, list) else v for k, v in results["setup"].items()})
    results["tables"] = {**render_tables(runs, setup, results.get("regimes", [])),
                         "costs": results.get("tables", {}).get("costs", "")}
    from graphpipe.serde import write_json_atomic

    write_json_atomic(out_dir / "results.json", results)
    return [out_dir / "results.json", *write_reports(results, out_dir)]


def tables_markdown(results: dict[str, Any]) -> str:
    """Every rendered table (each under its own heading) and the violations/failures summary."""
    setup = results.get("setup", {})
    parts = ["# Paper benchmark tables",
             f"Generated by `{REGENERATE}` from `results.json` (preset `{setup.get('preset', '?')}`, "
             f"{results.get('wall_time_s', 0.0):.0f} s); do not edit by hand. Re-render without rerunning: "
             f"`{REGENERATE} --tables-only`.",
             *[t.replace("### ", "## ", 1) for t in results.get("tables", {}).values()],
             "## Violations and failures", _summary_markdown(results)]
    return "\n\n".join(parts) + "\n"


def _summary_markdown(results: dict[str, Any]) -> str:
    runs, found = results.get("runs", []), results.get("violations", [])
    lines = [f"- configurations where graphpipe and a sequential planner both find a plan: "
             f"{num_compared(runs)}",
             f"- graphpipe slower than the `sequential` planner: "
             f"{sum(v['sequential_planner'] == 'sequential' for v in found)}",
             f"- graphpipe slower than any sequential plan of the same configuration: {len(found)}"]
    lines += [f"  - {v['experiment']} {v['model']} {v['num_devices']} dev batch {v['global_batch_size']} "
              f"{v['options']}: {v['graphpipe_samples_per_s']:,.0f} vs {v['sequential_planner']} "
              f"{v['sequential_samples_per_s']:,.0f} ({v['ratio']:.3f}x)" for v in found]
    lines.append(f"- failures (graphpipe gave up, or any planner crashed): {len(results.get('failures', []))}")
    lines += [f"  - {f['experiment']} {f['model']} {f['num_devices']} dev {f['planner']} {f['options']}: "
              f"{f['status']}: {f['reason']}" for f in results.get("failures", [])]
    return "\n".join(lines)


def num_compared(runs: Sequence[dict[str, Any]]) -> int:
    """Configurations in which graphpipe and at least one sequential planner both returned a plan."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["experiment"], r["model"], r["num_devices"], r["global_batch_size"], r.get("granularity", "op"),
                json.dumps(r["options"], sort_keys=True))

    ok = [r for r in runs if r["status"] == "ok"]
    graphpipe = {key(r) for r in ok if r["planner"] == "graphpipe"}
    return len(graphpipe & {key(r) for r in ok if r["planner"] in SEQUENTIAL_PLANNERS})


def headline_markdown(results: dict[str, Any]) -> str:
    """The 32-device tables of the top-level README (capped regime, then small), with how to regenerate them."""
    head, setup = results.get("headline"), results.get("setup", {})
    head = head if isinstance(head, dict) else {}  # format 1 kept a list: no regimes
    rule, paper, small = head.get("paper_rule", []), head.get("paper_regime", []), head.get("scaling", [])
    if not rule and not paper and not small:
        return "(no paper_rule, paper_regime or scaling runs in results.json)\n"
    n, granularity = head["num_devices"], setup.get("granularity", "layer")
    planners = list(setup.get("planners", (rule or paper or small)[0]["samples_per_s"]))
    small_ratio = {h["model"]: _ratio_at(h) for h in small}
    capped_ratio = {h["model"]: _ratio_at(h) for h in paper}
    header = ["model", "mini-batch", *planners, "graphpipe / best sequential"]
    rule_rows = [[h["model"], f"{h['global_batch_size']:,}", *[_headline_cell(h, p) for p in planners],
                  _ratio_at(h), capped_ratio.get(h["model"], "-"), small_ratio.get(h["model"], "-"), PAPER_SPEEDUP]
                 for h in rule]
    paper_rows = [[h["model"], f"{h['global_batch_size']:,}", *[_headline_cell(h, p) for p in planners],
                   _ratio_at(h), small_ratio.get(h["model"], "-"), PAPER_SPEEDUP] for h in paper]
    small_rows = [[h["model"], f"{h['global_batch_size']:,}", *[_headline_cell(h, p) for p in planners],
                   _ratio_at(h)] for h in small]
    parts = [f"Simulated training throughput at {n} V100s (Summit model, analytic costs, 1F1B, {granularity} "
             "granularity for every planner), samples/s (depth of graphpipe's and of the best sequential plan).",
             "**Paper's rule** (the headline): the largest power-of-two mini-batch whose activations, spread over "
             "the devices, fit in their memory (devices x 16 GiB / activation bytes of one sample; mmt at 8 "
             "devices: 128, as the paper states):",
             markdown([*header, "capped regime", f"small regime ({setup.get('batch_per_device', 8)} per device)",
                       "paper"], rule_rows) if rule else "(not run)",
             f"**Capped regime**: the largest power-of-two mini-batch at which the best sequential plan fits in "
             f"device memory, found by doubling from {setup.get('batch_per_device', 8)} samples per device and "
             f"capped at {setup.get('batch_cap', 0):,}; under 1F1B every mini-batch fits, so the cap ends the "
             "doubling: this is not the paper's rule, the mini-batch whose activations fit (README.md):",
             markdown([*header, f"small regime ({setup.get('batch_per_device', 8)} per device)", "paper"],
                      paper_rows) if paper else "(not run)",
             f"**Small regime**: {setup.get('batch_per_device', 8)} samples per device:",
             markdown(header, small_rows) if small else "(not run)", " ".join(_headline_notes(results, n))]
    return "\n\n".join(parts) + "\n"


PLANNER_NAMES = {"pipedream": "PipeDream", "piper": "Piper"}


def _and(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + (items[-1] if items else "")


def _budget(setup: dict[str, Any], planner: str) -> str:
    from graphpipe.planner.baselines.pipedream import MAX_PAIRS, MAX_STATES
    from graphpipe.planner.baselines.piper import DEFAULT_MAX_EXPLORED

    limit = f"{setup.get('baseline_time_limit_s', 0):g} s per call"
    if planner == "piper":
        return f"{setup.get('piper_max_downsets', 0):,} downsets kept, {DEFAULT_MAX_EXPLORED:,} explored, {limit}"
    return f"{MAX_STATES:,} antichain states, {MAX_PAIRS:,} stages between them, {limit}"


def _on_the_clock(reason: str) -> bool:
    """Whether a baseline gave up on its time limit (rather than on its downset, state or pair budget)."""
    from graphpipe.planner.baselines.pipedream import MAX_STATES

    built = re.search(r"with ([\d,]+) antichain states built", reason)  # the clock, or the state budget
    return ("the DP had reached" in reason or re.search(r"no strategy within [\d.]+ s", reason) is not None
            or (built is not None and int(built.group(1).replace(",", "")) < MAX_STATES))


def _ratio_at(head: dict[str, Any]) -> str:
    """graphpipe / best sequential with the mini-batch it holds at."""
    value = head.get("speedup")
    return f"{value:.2f}x at {head['global_batch_size']:,}" if value else "-"


def _headline_notes(results: dict[str, Any], n: int) -> list[str]:
    minutes = results.get("wall_time_s", 0.0) / 60
    notes = [f"Regenerate with `{REGENERATE}` ({minutes:.0f} minutes on 2 cores for this run), which writes these "
             "tables to `benchmarks/paper/HEADLINE.md`."]
    head = results.get("headline") if isinstance(results.get("headline"), dict) else {}
    setup = results.get("setup", {})
    for planner in setup.get("planners", []):
        lost = {e: [h["model"] for h in head.get(e, []) if h["samples_per_s"].get(planner, 0) is None] for e in REGIMES}
        if any(lost.values()):
            ran = [models for e, models in lost.items() if head.get(e)]
            where = (f"{_and(ran[0])} in every regime" if all(models == ran[0] for models in ran) else
                     " and ".join(f"{_and(models)} in the {REGIMES[e]}" for e, models in lost.items() if models))
            notes.append(f"{PLANNER_NAMES.get(planner, planner)} gave up at {n} devices on {where} "
                         f"(budgets: {_budget(setup, planner)}; what it counted is in TABLES.md, search time).")
    clock = [run for run in results.get("runs", []) if run.get("planner") in PLANNER_NAMES
             and run.get("status") == "gave_up" and _on_the_clock(run.get("reason", ""))]
    if clock:
        notes.append(f"{len(clock)} of the baselines' calls stopped on the time limit ("
                     f"{setup.get('baseline_time_limit_s', 0):g} s), not on a search budget: "
                     + _and(sorted({f"{PLANNER_NAMES[r['planner']]} on {r['model']}" for r in clock})) + ".")
    notes.append(_never_slower_note(results))
    notes.append("All tables: [TABLES.md](TABLES.md); the discussion: [docs/results.md](../../docs/results.md).")
    return notes


def _never_slower_note(results: dict[str, Any]) -> str:
    """How often `sequential`'s chain, and PipeDream's or Piper's, is faster than graphpipe's plan."""
    def configs(planners: Sequence[str]) -> int:
        return len({(v["experiment"], v["model"], v["num_devices"], v["global_batch_size"],
                     json.dumps(v["options"], sort_keys=True)) for v in found if v["sequential_planner"] in planners})

    found = results.get("violations", [])
    against_seq, against_others = configs(["sequential"]), configs(["pipedream", "piper"])
    return (f"In the {num_compared(results.get('runs', []))} configurations of the benchmark where graphpipe and a "
            "sequential planner both find a plan, graphpipe is "
            + ("never slower than the `sequential` planner" if against_seq == 0 else
               f"slower than the `sequential` planner in {against_seq} (listed in TABLES.md)")
            + ". Against `sequential` that holds by construction: `gp.plan` also plans `sequential` under the same "
            "options and keeps the faster simulation. PipeDream's and Piper's chains, which it does not search, are "
            "faster in "
            + ("none." if against_others == 0 else
               f"{against_others} configuration{'s' if against_others > 1 else ''} (listed in TABLES.md)."))


def _headline_cell(head: dict[str, Any], planner: str) -> str:
    """samples/s, with the depth for graphpipe and for the best sequential planner."""
    value = head["samples_per_s"].get(planner)
    if value is None:
        return "gave up" if planner in head["samples_per_s"] else "-"
    depth = head.get("depth", {}).get(planner)
    shown = planner in ("graphpipe", head.get("best_sequential")) and depth is not None
    return f"{value:,.0f}" + (f" (depth {depth})" if shown else "")


def _setup_dict(setup: Setup) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(setup).items()}


def _print_progress(r: Run) -> None:
    what = (f"{r.samples_per_s:,.0f} samples/s, depth {r.depth}, mb {_mb(r)}" if r.ok
            else f"{r.status}: {_short(r.reason, 100)}")
    extra = f" {r.options}" if r.options else ""
    print(f"  {r.experiment:12s} {r.model:10s} {r.num_devices:2d} dev {r.global_batch_size:6d} {r.granularity:5s} "
          f"{r.planner:13s}{extra}: {what} [{r.search_time_s:.1f} s]", file=sys.stderr, flush=True)


def _print_probe(p: Probe) -> None:
    what = (f"fits, depth {p.depth}, mb {'/'.join(map(str, p.micro_batch_sizes))}, "
            f"{p.peak_memory_bytes / 2**30:.2f} GiB" if p.fits else f"does not fit: {_short(p.reason, 100)}")
    print(f"  {'probe':12s} {p.model:10s} {p.num_devices:2d} dev {p.global_batch_size:6d} sequential: {what} "
          f"[{p.search_time_s:.1f} s]", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny presets and few configurations (seconds)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: benchmarks/paper; with --quick a new temporary folder)")
    parser.add_argument("--only", default=None, help=f"experiments, comma separated: {', '.join(EXPERIMENTS)}")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--models", default=None, help="models, comma separated (default: all three)")
    parser.add_argument("--baseline-time-limit", type=float, default=None, metavar="S",
                        help="seconds per PipeDream or Piper call (default 300; their search budgets still apply)")
    parser.add_argument("--tables-only", action="store_true",
                        help="re-write TABLES.md and HEADLINE.md from the existing results.json; runs nothing")
    args = parser.parse_args(argv)
    if args.tables_only:
        for path in rerender(args.out or HERE):
            print(f"wrote {path}")
        return 0
    setup = QUICK if args.quick else FULL
    if args.models:
        setup = replace(setup, models=tuple(args.models.split(",")))
    if args.baseline_time_limit is not None:
        setup = replace(setup, baseline_time_limit_s=args.baseline_time_limit)
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="graphpipe-paper-")) if args.quick else HERE)
    only = [e.strip() for e in args.only.split(",")] if args.only else None
    results = run_all(setup, out_dir, experiments=only, progress=_print_progress, plots=not args.no_plots)
    print("\n\n".join(results["tables"].values()))
    print("\n### Real runs (benchmarks/runtime)\n\n" + runtime_table(HERE.parent.parent))
    print(f"\nviolations (graphpipe slower than a sequential plan): {len(results['violations'])}")
    for v in results["violations"]:
        print(f"  {v}")
    for f in results["failures"]:
        print(f"  failure: {f['experiment']} {f['model']} {f['num_devices']} dev {f['planner']} "
              f"{f['options']}: {f['status']}: {f['reason']}")
    print(f"\nwrote {out_dir / 'results.json'}, TABLES.md and HEADLINE.md in {results['wall_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
