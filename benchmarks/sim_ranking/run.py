"""Does the simulator rank plans as this machine runs them? Candidate plans of three models on 2 ranks.

    .venv/bin/python benchmarks/sim_ranking/run.py                   # results.json and a table per model
    .venv/bin/python benchmarks/sim_ranking/run.py --models mmt --rounds 3 --recordings 1

Per model (the zoo's tiny presets, widened as in `benchmarks/runtime`, mini-batch 32):

1. Calibrate this host once, as a user does: `graphpipe calibrate --keep-noisy` into a folder of its own (its
   reference model is none of these). Per model: profile every op on one thread and fit the `cpu` device to
   it; the two-process calibration scales that profile and adds the host's overheads and links; beside it,
   the one-process calibration `benchmarks/runtime` uses (the executor's per-action overheads on one rank,
   the optimizer step, the ping-pong link).
2. Candidates: the best plans of the `graphpipe` and `sequential` planners for 2 devices at each micro-batch
   size 1-16 on its own (`plan_candidates`, a shallower alternative per size included), deduplicated, and the
   whole model data parallel on both ranks at micro-batches 2-16.
3. Simulate each with everything calibrated (measured op costs, per-action overheads, the measured links,
   2 cores shared by the ranks, the loss all-reduce after the schedule: `bench_runtime.predict`), with each
   calibration.
4. Measure: 2 gloo ranks, one thread each (2 cores: no oversubscription), every candidate trained with Adam,
   `--rounds` rounds of `--iters` iterations, the candidates interleaved within each round so that machine
   noise hits each alike; the median over rounds (and the fastest round beside it: noise here only slows).
5. `--recordings` times over, each from its own calibration: one calibration and one measurement are each a
   few minutes of a host whose speed moves.

Reported: per plan the simulated and measured iteration and the error; per model the median |error|, the
rank agreement of the two orders (Kendall's tau) and whether the simulator's fastest plan is the measured
fastest, or within the measured spread of it; then per model over the recordings. Run it on a quiet
machine: it times the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))

from bench_runtime import TERMS, calibrated_device, join_group, predict, spawn_ranks, timed_round  # noqa: E402
from calibrate_host import measure_executor_overheads, measure_overheads  # noqa: E402

from graphpipe.stages.stage_graph import Plan  # noqa: E402

WORLD, BATCH = 2, 32
SIZES = (1, 2, 4, 8, 16)
MOST_CANDIDATES = 8
VARIANTS = ("collective_alone",)  # the kept calibration less one term, simulated beside it
MODELS: dict[str, dict[str, Any]] = {
    "mmt": {"num_branches": 2, "num_layers": 2, "hidden": 64, "ffn_hidden": 256, "seq_len": 32},
    "transformer": {"num_layers": 4, "hidden": 64, "ffn_hidden": 256, "seq_len": 32},
    "candle_uno": {},
}


# ---- calibration and candidates (parent process) -------------------------------------------------
def calibrate_host() -> dict[str, Any]:
    """`graphpipe calibrate --json` as a user runs it, into a folder of its own (the user's kept calibration is
    neither read nor changed): its reference model is none of the candidates' models."""
    import subprocess
    import tempfile

    from graphpipe.cost.host_cache import CACHE_ENV

    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-m", "graphpipe.cli.main", "calibrate", "--keep-noisy", "--json"],
                              capture_output=True, text=True, timeout=900,
                              env={**os.environ, "OMP_NUM_THREADS": "1", CACHE_ENV: folder})
    if done.returncode != 0:
        raise RuntimeError(f"graphpipe calibrate failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def prepare(name: str, ping: dict[str, float], calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    from graphpipe.cost.analytic import analytic_costs
    from graphpipe.cost.calibrate import fit_device
    from graphpipe.cost.cluster import Cluster, Link
    from graphpipe.cost.host_calibration import HostCalibration
    from graphpipe.cost.profile import profile
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model
    from graphpipe.planning import plan

    zoo = load_model(name, "tiny", batch_size=BATCH, **MODELS[name])
    graph = capture(zoo.model, zoo.inputs)
    measured = profile(graph, zoo.model, SIZES, example_inputs=zoo.inputs, num_threads=1, progress=False)
    fit = fit_device(graph, measured)
    costs = analytic_costs(graph, fit.device, micro_batch_sizes=SIZES)
    loopback = Link(name="gloo-loopback-measured", latency_us=ping["latency_us"],
                    bandwidth_gb_per_s=ping["bandwidth_gb_per_s"])
    plain = dataclasses.replace(Cluster.preset("local-cpu", WORLD), device=fit.device, cores_per_node=None)
    # one-process calibration: the executor's overheads on one rank, the ops as profiled alone
    probe = plan(graph, costs, plain, BATCH, planner="sequential", micro_batch_sizes=[8])
    overheads = measure_overheads(zoo.model, zoo.inputs, zoo.targets, zoo.loss_fn, probe, measured, 8)
    whole = plan(graph, costs, plain.with_devices(1), BATCH, planner="sequential", micro_batch_sizes=[1])
    overheads["executor"] = measure_executor_overheads(
        load_model(name, "tiny", batch_size=BATCH, seed=0, **MODELS[name]).model, zoo.inputs, zoo.targets,
        zoo.loss_fn, whole, measured)
    one = dataclasses.replace(plain, device=calibrated_device(fit.device, overheads), intra_node=loopback,
                              inter_node=loopback, cores_per_node=os.cpu_count() or 1)
    # this host as `graphpipe calibrate` measured it (its reference model is none of these): the compute scale
    # and overheads of ranks running a pipeline, or of one rank alone for a plan that leaves the other idle,
    # on this model's profile; its links
    calibration = calibration or calibrate_host()
    link, collective = Link.from_dict(calibration["link"]), Link.from_dict(calibration["collective"])
    alone = Link.from_dict(calibration["details"].get("all_reduce_alone", calibration["collective"]))
    hosts = {world: HostCalibration(**calibration["details"]["host" if world > 1 else "host_single"])
             for world in (1, WORLD)}
    one_tables = {"measured": measured, "fitted": costs}
    tables = {world: {"measured": host.costs(measured), "fitted": costs} for world, host in hosts.items()}
    # the calibration as kept, and beside it with the all-reduce link timed alone (same host, same run)
    clusters = {(world, key): dataclasses.replace(one, device=host.device(fit.device), intra_node=link,
                                                  inter_node=link, collective=reduce_on)
                for world, host in hosts.items()
                for key, reduce_on in (("simulated_s", collective), ("simulated_collective_alone_s", alone))}
    rows = []
    for candidate in candidates(graph, costs, plain):
        world = min(candidate.world_size, WORLD)
        row = {"plan": candidate.to_dict(), "label": label(candidate),
               "simulated_one_process_s": predict(candidate, one_tables, one, fit.device, TERMS)}
        for (on_world, key), on_host in clusters.items():
            if on_world == world:
                row[key] = predict(candidate, tables[world], on_host, fit.device, TERMS, alone)
        rows.append(row)
    host, cluster = hosts[WORLD], clusters[(WORLD, "simulated_s")]
    return {"model": name, "options": MODELS[name], "calibration": str(fit), "host": host.to_dict(),
            "cluster": cluster.to_dict(), "one_process_cluster": one.to_dict(), "overheads": overheads,
            "candidates": rows, "measured_table": tables[WORLD]["measured"]}


def candidates(graph: Any, costs: Any, cluster: Any) -> list[Plan]:
    """Distinct plans of both planners over the micro-batch sizes, best TPS first, at most MOST_CANDIDATES
    (the first per stage count and micro-batch size before the rest, so that the set spans both)."""
    from graphpipe.planner.api import plan_candidates

    found: dict[Any, Plan] = {}
    for planner in ("graphpipe", "sequential"):
        for size in SIZES:
            for plan in plan_candidates(graph, costs, cluster, BATCH, planner=planner, micro_batch_sizes=[size],
                                        every_size=True):
                key = tuple((stage.ops, stage.ranks, stage.micro_batch_size) for stage in plan.stages)
                found.setdefault(key, plan)
    one_stage = plan_candidates(graph, costs, cluster.with_devices(1), BATCH, planner="sequential",
                                micro_batch_sizes=[size for size in SIZES if size >= WORLD], every_size=True)
    for plan in one_stage:  # data parallel: the whole model on both ranks
        stage = dataclasses.replace(plan.stages[0], ranks=tuple(range(WORLD)))
        found.setdefault(("data parallel", stage.micro_batch_size),
                         dataclasses.replace(plan, stages=(stage,), num_devices=WORLD))
    ranked = sorted(found.values(), key=lambda p: p.predicted_tps_ms)
    kinds: dict[Any, Plan] = {}
    for plan in ranked:
        kinds.setdefault((plan.num_stages, plan.depth, plan.stages[0].micro_batch_size), plan)
    chosen = list(kinds.values())[:MOST_CANDIDATES]
    chosen += [plan for plan in ranked if plan not in chosen][:MOST_CANDIDATES - len(chosen)]
    return chosen


def label(plan: Plan) -> str:
    sizes = "/".join(str(s) for s in sorted({stage.micro_batch_size for stage in plan.stages}))
    ranks = "+".join(str(len(stage.ranks)) for stage in plan.stages)
    return f"{plan.num_stages} stage(s), depth {plan.depth}, ranks {ranks}, micro-batch {sizes}"


# ---- ranks --------------------------------------------------------------------------------------
def _runners(item: dict[str, Any]) -> list[Any]:
    from graphpipe.models import load_model
    from graphpipe.runtime.trainer import PipelineTrainer
    from graphpipe.train import shuffled_batch

    zoo = load_model(item["model"], "tiny", batch_size=BATCH, seed=0, **MODELS[item["model"]])
    inputs, targets = shuffled_batch(zoo, 0, 0)
    runners = []
    for row in item["candidates"]:
        model = load_model(item["model"], "tiny", batch_size=BATCH, seed=0, **MODELS[item["model"]]).model
        trainer = PipelineTrainer(model, Plan.from_dict(row["plan"]), loss_fn=zoo.loss_fn, schedule="1f1b",
                                  optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4))
        runners.append(lambda t=trainer: t.step(inputs, targets))
    return runners


def _rank_main(rank: int, port: int, prepared: list[dict[str, Any]], rounds: int, iters: int, out: Any) -> None:
    try:
        pids = join_group(rank, port, WORLD)
        for item in prepared:
            runners = _runners(item)
            for run in runners:  # warm-up
                run()
                run()
            times: list[list[float]] = [[] for _ in runners]
            other: list[list[float]] = [[] for _ in runners]
            for _ in range(rounds):
                for idx, run in enumerate(runners):
                    seconds, other_share, _ = timed_round(run, iters, pids, rank)
                    times[idx].append(seconds)
                    if rank == 0:
                        other[idx].append(other_share)
            if rank == 0:
                out.put(("times", item["model"], {"times": times, "other": other}))
        dist.destroy_process_group()
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
    out.put(("done", rank, None))


def measure(prepared: list[dict[str, Any]], rounds: int, iters: int) -> dict[str, Any]:
    messages = spawn_ranks(WORLD, _rank_main, (prepared, rounds, iters))
    return {key: payload for kind, key, payload in messages if kind == "times"}


# ---- report -------------------------------------------------------------------------------------
def kendall_tau(first: list[float], second: list[float]) -> float:
    """Rank agreement of two orders of the same items: +1 the same order, -1 reversed (ties count 0)."""
    pairs = [(i, j) for i in range(len(first)) for j in range(i + 1, len(first))]
    if not pairs:
        return 1.0
    signs = [((first[i] > first[j]) - (first[i] < first[j])) * ((second[i] > second[j]) - (second[i] < second[j]))
             for i, j in pairs]
    return sum(signs) / len(pairs)


def summarise(item: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for row, seconds, other in zip(item["candidates"], measured["times"], measured["other"]):
        median = statistics.median(seconds)
        rows.append({"label": row["label"], "simulated_ms": row["simulated_s"] * 1e3, "measured_ms": median * 1e3,
                     "measured_min_ms": min(seconds) * 1e3, "measured_max_ms": max(seconds) * 1e3,
                     "error": row["simulated_s"] / median - 1,
                     "error_fastest_round": row["simulated_s"] / min(seconds) - 1,
                     "one_process_error": row["simulated_one_process_s"] / median - 1,
                     **{f"{variant}_error": row[f"simulated_{variant}_s"] / median - 1 for variant in VARIANTS},
                     "other_load": other, "plan": row["plan"]})
    simulated = [r["simulated_ms"] for r in rows]
    actual = [r["measured_ms"] for r in rows]
    sim_best = min(range(len(rows)), key=simulated.__getitem__)
    real_best = min(range(len(rows)), key=actual.__getitem__)
    return {"model": item["model"], "options": item["options"], "calibration": item["calibration"],
            "cluster": item["cluster"], "rows": rows,
            "host": item["host"], "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
            "median_abs_error_fastest_round": statistics.median(abs(r["error_fastest_round"]) for r in rows),
            "one_process_median_abs_error": statistics.median(abs(r["one_process_error"]) for r in rows),
            **{f"median_abs_error_{variant}": statistics.median(abs(r[f"{variant}_error"]) for r in rows)
               for variant in VARIANTS},
            "kendall_tau": kendall_tau(simulated, actual),
            "simulated_fastest": rows[sim_best]["label"], "measured_fastest": rows[real_best]["label"],
            "fastest_agrees": sim_best == real_best
            or rows[sim_best]["measured_ms"] <= rows[real_best]["measured_max_ms"]}


def render(summary: dict[str, Any]) -> str:
    lines = [f"{summary['model']}: median |error| {summary['median_abs_error']:.0%} (against each plan's fastest "
             f"round {summary['median_abs_error_fastest_round']:.0%}; one-process calibration: "
             f"{summary['one_process_median_abs_error']:.0%}), Kendall's tau "
             f"{summary['kendall_tau']:+.2f}, simulator's fastest is the measured fastest (or within its spread): "
             f"{'yes' if summary['fastest_agrees'] else 'no'}",
             f"  {'plan':48} {'simulated ms':>12} {'measured ms (median [min, max])':>32} {'error':>7} "
             f"{'one-process error':>17}"]
    for row in summary["rows"]:
        spread = f"{row['measured_ms']:.2f} [{row['measured_min_ms']:.2f}, {row['measured_max_ms']:.2f}]"
        lines.append(f"  {row['label']:48} {row['simulated_ms']:>12.2f} {spread:>32} {row['error']:>+7.0%} "
                     f"{row['one_process_error']:>+17.0%}")
    return "\n".join(lines)


def record(models: list[str], rounds: int, iters: int) -> dict[str, Any]:
    """One recording: calibrate this host, then simulate and measure every model's candidates."""
    calibration = calibrate_host()
    link, collective, host = calibration["link"], calibration["collective"], calibration["details"]["host"]
    print(f"this host: loopback {link['latency_us']:.0f} us one way, {link['bandwidth_gb_per_s']:.2f} GB/s; "
          f"all-reduce in training as a ring on {collective['latency_us']:.0f} us, "
          f"{collective['bandwidth_gb_per_s']:.2f} GB/s; "
          f"a pipeline's ops x{host['compute_scale']:.2f} per sample, x{host.get('fwd_call_scale') or 0:.2f}/"
          f"x{host.get('bwd_call_scale') or 0:.2f} per call, actions +{host['fwd_action_overhead_us']:.0f}/"
          f"+{host['bwd_action_overhead_us']:.0f} us, step +{host['step_overhead_us']:.0f} us (fit error "
          f"{host['median_rel_error']:.0%}, spread {host['iteration_spread']:.0%})", flush=True)
    prepared = []
    for name in models:
        prepared.append(prepare(name, link, calibration))
        print(f"{name}: {prepared[-1]['calibration']}; {len(prepared[-1]['candidates'])} candidates", flush=True)
    measured = measure(prepared, rounds, iters)
    summaries = [summarise(item, measured[item["model"]]) for item in prepared]
    for summary in summaries:
        print(render(summary), flush=True)
    return {"host_calibration": calibration, "models": summaries}


def across(recordings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model over the recordings: each one's median |error| and whether its fastest agreed."""
    rows = []
    for name in [summary["model"] for summary in recordings[0]["models"]]:
        found = [summary for rec in recordings for summary in rec["models"] if summary["model"] == name]
        errors = [summary["median_abs_error"] for summary in found]
        fastest_round = [summary["median_abs_error_fastest_round"] for summary in found]
        rows.append({"model": name, "median_abs_errors": errors, "median_over_recordings": statistics.median(errors),
                     "within_15": sum(error <= 0.15 for error in errors),
                     "median_abs_errors_fastest_round": fastest_round,
                     "within_15_fastest_round": sum(error <= 0.15 for error in fastest_round),
                     "fastest_agrees": sum(summary["fastest_agrees"] for summary in found),
                     "kendall_tau": [summary["kendall_tau"] for summary in found], "recordings": len(found),
                     **{f"median_over_recordings_{variant}": statistics.median(
                         summary[f"median_abs_error_{variant}"] for summary in found) for variant in VARIANTS}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--recordings", type=int, default=3,
                        help="independent recordings, each with its own calibration (default 3)")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    recordings = []
    for index in range(args.recordings):
        print(f"recording {index + 1} of {args.recordings}", flush=True)
        recordings.append(record(args.models.split(","), args.rounds, args.iters))
    summary = across(recordings)
    for later in recordings[1:]:  # the plans are the first recording's (the same candidates, in its order)
        for model in later["models"]:
            for row in model["rows"]:
                row.pop("plan", None)
    for row in summary:
        errors = ", ".join(f"{error:.0%}" for error in row["median_abs_errors"])
        print(f"{row['model']}: median |error| per recording {errors} (median {row['median_over_recordings']:.0%}; "
              f"within 15% in {row['within_15']} of {row['recordings']}; against each plan's fastest round within "
              f"15% in {row['within_15_fastest_round']}); fastest agrees in {row['fastest_agrees']} of "
              f"{row['recordings']}; the same recordings simulated with the all-reduce measured alone "
              f"{row['median_over_recordings_collective_alone']:.0%}")
    Path(args.out).write_text(json.dumps({"world_size": WORLD, "batch": BATCH, "rounds": args.rounds,
                                          "iters": args.iters, "across_recordings": summary,
                                          "recordings": recordings}))


if __name__ == "__main__":
    main()
