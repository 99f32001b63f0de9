"""GPU readiness check for graphpipe: CUDA tests, multi-rank pipelines on the GPU(s) equal to one device,
bf16, a CUDA profile, throughput against torch pipelining and on its own.

    bash benchmarks/gpu/run.sh                         # `make gpu-check`: finds the Python, installs, runs this
    GPU_CHECK_ALLOW_CPU=1 bash benchmarks/gpu/run.sh   # rehearsal without CUDA: every stage on the CPU, small sizes

On one GPU the pipeline is tested with ranks that share it (`graphpipe train --share-gpu`: gloo, every
message staged through host memory; NCCL refuses two ranks on one device): fork/join plans with a shared
weight and a data-parallel stage in float64 against one device (`pipeline_check.py`), `graphpipe train` in
fp32 and bf16 with a trace timed by CUDA events, and the throughput against torch pipelining on the same
chain (`vs_torch.py`). With two or more GPUs the same fork/join plans run over NCCL, a GPU per rank; with
one, the summary says "multi-rank NCCL: not tested".

Every command runs under `timeout`. The stages' limits add up to less than the budget (GPU_CHECK_BUDGET_S
seconds from when run.sh started); a stage whose limit no longer fits in what is left is skipped and listed,
never failed, so the check cannot fail on time alone. Results go to benchmarks/gpu/results/<UTC stamp>-<mode>/
(GPU_CHECK_OUT overrides the parent folder): summary.json, summary.md, the cost tables, traces, the pytest
JUnit files and one log per command. Exit 0: every stage that ran passed; 1: a stage failed; 2: no CUDA (and
no GPU_CHECK_ALLOW_CPU=1).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
ALLOW_CPU = os.environ.get("GPU_CHECK_ALLOW_CPU") == "1"
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", "470"))  # ~8 minutes, install included
RESERVE_S = 10.0  # kept back for writing the summary
INSTALL_ALLOWANCE_S = 15.0  # what run.sh's probe and install may take before this driver starts
MAX_RANKS = 4
SHARED_RANKS = 4  # ranks that share the GPU (dp_sink4 needs 4)
EQUIVALENCE_STEPS = 5
REFERENCE_S = 20.0  # what a stage keeps back for the single-device reference run
EQUIVALENCE_LR = 0.01
# fp32 on a GPU: the pipeline's GEMMs have other shapes than one device's, so cuBLAS may reduce in another
# order; five Adam steps carry that into the losses. The float64 checks (pipeline_check.py) are the strict ones.
GPU_FP32_RTOL = 1e-3
BF16_RTOL = 5e-2  # bf16's first loss (no update yet) against fp32's: the rounding of bf16 matmuls alone
PACKAGES = ("numpy", "matplotlib", "tqdm", "pytest", "hypothesis")
# the CUDA tests: on a GPU each must pass, not be skipped
CUDA_TESTS = ("test_profiles_on_cuda_without_moving_the_callers_model", "test_host_staging_on_cuda",
              "test_cuda_clock_resolves_after_the_kernels")
CUDA_TEST_FILES = ("tests/cost/test_profile.py", "tests/runtime/test_host_staging.py",
                   "tests/runtime/test_action_clock.py")
HERE = Path(__file__).resolve().parent
# The planner imports numpy; rank 0 of `graphpipe.train` draws a tqdm bar, and the profiler opens one
# (disabled) even with --no-progress: every stage needs both.
NEEDS = ("numpy", "tqdm")


# ---- what runs ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Workload:
    """A zoo model at one size; the same spec drives `graphpipe train`, `graphpipe profile` and the reference."""

    name: str
    model: str = "mmt"
    preset: str = "tiny"
    options: dict[str, Any] = field(default_factory=dict)
    batch: int = 8

    def cli_args(self) -> list[str]:
        args = ["--model", self.model, "--preset", self.preset, "--batch", str(self.batch)]
        for key, value in self.options.items():
            args += ["--set", f"{key}={value}"]
        return args


TINY = Workload(name="mmt-tiny")
# Big enough that a GPU step is not all launch overhead (~50M parameters), small enough to start in seconds.
MEDIUM = Workload(name="mmt-medium", batch=32, options={"hidden": 512, "num_heads": 8, "ffn_hidden": 2048,
                                                         "seq_len": 128, "num_layers": 4, "num_classes": 1000})
MEDIUM_ON_CPU = Workload(name="mmt-medium", options={"hidden": 32, "ffn_hidden": 64, "seq_len": 16})


@dataclass(kw_only=True)
class Context:
    """Facts about this machine and run that every stage reads."""

    cuda: bool
    gpus: int
    missing: frozenset[str]
    out: Path
    start: float  # time.time() when run.sh started
    commands: list[tuple[str, str]] = field(default_factory=list)  # (stage, command as run)
    references: dict[str, list[float] | None] = field(default_factory=dict)  # single-device losses, by device

    @property
    def ranks(self) -> int:
        """Ranks of the device runs: one per GPU (NCCL needs a device each), at most MAX_RANKS (GPU_CHECK_RANKS
        lowers it; on CPU it sets it, default 2)."""
        wanted = int(os.environ.get("GPU_CHECK_RANKS", MAX_RANKS if self.cuda else 2))
        return max(1, min(self.gpus, wanted)) if self.cuda else max(1, wanted)

    @property
    def shared_ranks(self) -> int:
        """Ranks of the runs that share the GPU (GPU_CHECK_SHARED_RANKS; default 4, on the CPU too)."""
        return max(2, int(os.environ.get("GPU_CHECK_SHARED_RANKS", SHARED_RANKS)))

    @property
    def steps(self) -> int:
        return 30 if self.cuda else 8

    @property
    def warmup(self) -> int:
        """Leading steps left out of the statistics: CUDA context, cuBLAS handles, allocator growth."""
        return 5 if self.cuda else 2

    @property
    def device(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        return BUDGET_S - self.elapsed() - RESERVE_S


@dataclass(kw_only=True)
class StageResult:
    name: str
    status: str  # pass | fail | skip
    detail: str
    seconds: float = 0.0
    commands: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


StageFn = Callable[[Context, str, float], StageResult]


@dataclass(frozen=True)
class Stage:
    name: str
    run: StageFn
    limit_s: float
    needs: tuple[str, ...]
    needs_gpus: int = 0  # on CUDA, skipped (and said) with fewer GPUs


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    log: Path

    @property
    def timed_out(self) -> bool:
        return self.returncode in (124, 137)

    def why(self) -> str:
        """One phrase for a failed command, pointing at its log."""
        how = "timed out" if self.timed_out else f"exit {self.returncode}"
        return f"{how}; log {self.log}"


def say(ctx: Context | None, text: str) -> None:
    stamp = f" +{ctx.elapsed():.0f}s" if ctx else ""
    print(f"[gpu-check{stamp}] {text}", flush=True)


# ---- running commands --------------------------------------------------------------------------
def run_logged(ctx: Context, stage: str, label: str, argv: list[str], limit_s: float,
               env: dict[str, str] | None = None) -> Ran:
    """Run argv under coreutils `timeout` (SIGTERM to its process group, SIGKILL 10 s later): stdout is
    returned, stdout and stderr go to logs/<label>.log, and the command is recorded as it was run."""
    limit = max(5, int(limit_s))
    wrapped = ["timeout", "-k", "10", str(limit), *argv] if shutil.which("timeout") else argv
    shown = " ".join([*(f"{key}={shlex.quote(value)}" for key, value in (env or {}).items()), shlex.join(wrapped)])
    ctx.commands.append((stage, shown))
    log = ctx.out / "logs" / f"{label}.log"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "w") as handle:
        handle.write(f"$ {shown}\n")
        handle.flush()
        try:
            proc = subprocess.run(wrapped, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=handle,
                                  text=True, timeout=limit + 30)
            code, stdout = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as err:  # only if `timeout` itself is missing or stuck
            code, stdout = 124, err.stdout if isinstance(err.stdout, str) else ""
        handle.write(f"\n--- stdout ---\n{stdout}\n--- exit {code} ---\n")
    if code != 0:
        _print_tail(log)
    return Ran(code, stdout, log)


def _print_tail(log: Path, lines: int = 15) -> None:
    """The end of a failed command's log, so the console says why without opening files."""
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    print("\n".join(f"    | {line}" for line in tail), flush=True)


def graphpipe_argv(*args: str) -> list[str]:
    """`graphpipe ...` as `python -m graphpipe.cli.main ...`: works without the console script too (PYTHONPATH)."""
    return [sys.executable, "-m", "graphpipe.cli.main", *args]


def train_argv(workload: Workload, nproc: int, steps: int, *extra: str) -> list[str]:
    return graphpipe_argv("train", *workload.cli_args(), "--nproc", str(nproc), "--steps", str(steps), "--json",
                          *extra)


def pytest_argv(ctx: Context, label: str, targets: list[str]) -> list[str]:
    """pytest without its cache (nothing written into the tree) and with a JUnit file to count from;
    without hypothesis, tests/conftest.py cannot import, so it is skipped (run_logged sets its env vars)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={ctx.out / label}.xml"]
    if "hypothesis" in ctx.missing:  # and a half-installed hypothesis's pytest plugin must not load either
        argv += ["--noconftest", "-p", "no:hypothesispytest"]
    return [*argv, *targets]


def junit_counts(path: Path) -> tuple[dict[str, int], dict[str, str]]:
    """(passed/failed/errors/skipped counts, status by test name) from a pytest JUnit file."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    status: dict[str, str] = {}
    if not path.exists():
        return counts, status
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = ("failed" if "failure" in kinds else "errors" if "error" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        counts[outcome] += 1
        status[case.get("name", "?")] = outcome
    return counts, status


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{value} {key}" for key, value in counts.items() if value) or "no tests ran"


# ---- stages ------------------------------------------------------------------------------------
def cuda_tests(ctx: Context, name: str, limit: float) -> StageResult:
    """The profiler's, the host staging's and the CUDA clock's tests; on a GPU the CUDA ones must pass, not be
    skipped."""
    ran = run_logged(ctx, name, name, pytest_argv(ctx, name, list(CUDA_TEST_FILES)), limit)
    counts, status = junit_counts(ctx.out / f"{name}.xml")
    cuda = {test: status.get(test, "not collected") for test in CUDA_TESTS}
    ok = ran.returncode == 0 and (all(value == "passed" for value in cuda.values()) or not ctx.cuda)
    shown = "; ".join(f"{test}: {value}" for test, value in cuda.items())
    detail = f"{counts_text(counts)}; {shown}" + ("" if ok else f" ({ran.why()})")
    return StageResult(name=name, status="pass" if ok else "fail", detail=detail,
                       data={"tests": counts, "cuda_tests": cuda})


def pipeline_equivalence(ctx: Context, name: str, limit: float, *, transport: str) -> StageResult:
    """`pipeline_check.py`: fork/join plans with a shared weight and a data-parallel stage, in float64, equal to
    one device. `shared`: the ranks share the GPU (gloo, host-staged); `nccl`: a GPU per rank (on the CPU
    rehearsal: plain gloo, the same plumbing)."""
    ranks = ctx.shared_ranks if transport == "shared" else ctx.ranks
    used = transport if ctx.cuda or transport == "shared" else "gloo"
    argv = [sys.executable, str(HERE / "pipeline_check.py"), "--transport", used, "--ranks", str(ranks),
            "--device", ctx.device]
    ran = run_logged(ctx, name, name, argv, limit)
    report = _json_or_none(ran.stdout)
    if report is None:
        return StageResult(name=name, status="fail", detail=f"pipeline_check: {ran.why()}")
    checks = report["checks"]
    gap = max((check["max_rel_loss_diff"] for check in checks), default=math.inf)
    runs = ", ".join(f"{check['scenario']}/{check['schedule']} ({check['ranks_used']} ranks)" for check in checks)
    failed = [f"{check['scenario']}/{check['schedule']}: {'; '.join(check['problems'])}" for check in checks
              if not check["passed"]]
    where = f"{used}, {ranks} ranks on {ctx.device}{' (shared)' if transport == 'shared' else ''}"
    data = {"transport": used, "ranks": ranks, "report": report}
    if ran.returncode != 0 or failed or not checks:
        detail = f"{where}: " + ("; ".join(failed) if failed else f"no scenario ran ({ran.why()})")
        return StageResult(name=name, status="fail", detail=detail, data=data)
    left = f"; left out: {', '.join(f'{k} ({v})' for k, v in report['left_out'].items())}" if report["left_out"] else ""
    detail = f"{where}: {runs} equal one device in float64 (max rel loss diff {gap:.1e}){left}"
    return StageResult(name=name, status="pass", detail=detail, data=data)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def shared_gpu_train(ctx: Context, name: str, limit: float, *, dtype: str) -> StageResult:
    """`graphpipe train --share-gpu`: a multi-rank graph plan of mmt tiny whose ranks share the GPU, its losses
    against one device's (fp32: equal within GPU_FP32_RTOL; bf16: finite, the first within BF16_RTOL of fp32's), its
    trace timed by CUDA events and the memory outside torch's allocator reported (on a GPU)."""
    end = time.time() + limit
    ranks = ctx.shared_ranks
    trace = ctx.out / f"trace-{name}"
    extra = ["--share-gpu", "--use-all-devices", "--lr", str(EQUIVALENCE_LR), "--seed", "0", "--log-every", "1",
             "--dtype", dtype, "--trace", str(trace)]
    ran = run_logged(ctx, name, name, train_argv(TINY, ranks, EQUIVALENCE_STEPS, *extra), _train_limit(ctx, end))
    if ran.returncode != 0:
        return StageResult(name=name, status="fail", detail=f"graphpipe train --share-gpu: {ran.why()}")
    report = json.loads(ran.stdout)
    rows = report["steps"]
    losses = [row["loss"] for row in rows]
    reference = _reference(ctx, name, end - time.time())
    clock = _trace_clock(trace)
    outside = max((max(row.get("outside_allocator_bytes") or [0]) for row in rows), default=0)
    data: dict[str, Any] = {"backend": "gloo, host-staged", "ranks": ranks, "world_size": report["world_size"],
                            "num_stages": report["num_stages"], "dtype": dtype, "losses": losses,
                            "reference": reference, "trace_clock": clock, "outside_allocator_bytes_max": outside,
                            "trace": str(trace)}
    problems = []
    if ctx.cuda and clock != "CUDA events":
        problems.append(f"the trace's clock is {clock!r}, not CUDA events")
    if ctx.cuda and outside <= 0:
        problems.append("no device memory reported outside torch's allocator (the CUDA context alone has some)")
    if dtype == "fp32":
        result = _judge_equivalence(name, data, rtol=GPU_FP32_RTOL if ctx.cuda else 1e-5, multi_rank=True)
    else:
        result = _judge_bf16(name, data)
    if problems:
        result.status, result.detail = "fail", f"{result.detail}; {'; '.join(problems)}"
    elif ctx.cuda:
        result.detail += f"; trace by {clock}; {outside / 2**20:.0f} MiB outside torch's allocator"
    return result


def _train_limit(ctx: Context, end: float) -> float:
    """The training command's share of a stage that ends at `end`: all of it once the reference is known,
    else all but REFERENCE_S for computing it."""
    return end - time.time() - (2 if ctx.device in ctx.references else REFERENCE_S)


def _reference(ctx: Context, name: str, limit: float) -> list[float] | None:
    """The single-device fp32 losses on this machine's device, computed once."""
    device = ctx.device
    if device not in ctx.references:
        ctx.references[device] = reference_via_subprocess(ctx, name, device, limit, None)
    return ctx.references[device]


def _trace_clock(folder: Path) -> str | None:
    try:
        return json.loads((folder / "rank_0.json").read_text())["otherData"].get("clock")
    except (OSError, ValueError, KeyError):
        return None


def _judge_bf16(name: str, data: dict[str, Any]) -> StageResult:
    losses, reference = data["losses"], data["reference"]
    where = f"{data['backend']}, plan on {data['world_size']}/{data['ranks']} ranks, {data['num_stages']} stage(s)"
    if reference is None:
        return StageResult(name=name, status="fail", detail="the single-device reference run failed", data=data)
    first = abs(losses[0] - reference[0]) / max(abs(reference[0]), 1e-12) if losses else math.inf
    data["first_loss_rel_diff"] = first
    data["max_rel_diff"] = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference)), default=math.inf)
    problems = []
    if len(losses) != len(reference) or not all(math.isfinite(loss) for loss in losses):
        problems.append(f"{len(losses)} losses, finite: {all(math.isfinite(loss) for loss in losses)}")
    if first > BF16_RTOL:
        problems.append(f"the first loss differs from fp32's by {first:.2e} (tolerance {BF16_RTOL:g})")
    if data["world_size"] < 2:
        problems.append("the plan uses a single rank")
    if problems:
        return StageResult(name=name, status="fail", detail=f"{where}: {'; '.join(problems)}", data=data)
    return StageResult(name=name, status="pass", data=data,
                       detail=f"{where}: bf16, {len(losses)} finite losses, the first {first:.1e} from fp32's "
                              f"(then up to {data['max_rel_diff']:.1e} as the runs drift apart)")


def train_equivalence(ctx: Context, name: str, limit: float) -> StageResult:
    """`graphpipe train` over NCCL, a GPU per rank (one GPU: one rank), losses equal single-device training of the
    same model, data and Adam steps; on the CPU rehearsal the same over gloo."""
    end = time.time() + limit
    ranks = ctx.ranks
    extra = ["--lr", str(EQUIVALENCE_LR), "--seed", "0", *(["--use-all-devices"] if ranks > 1 else [])]
    ran = run_logged(ctx, name, name, train_argv(TINY, ranks, EQUIVALENCE_STEPS, *extra), _train_limit(ctx, end))
    if ran.returncode != 0:
        return StageResult(name=name, status="fail", detail=f"graphpipe train: {ran.why()}")
    report = json.loads(ran.stdout)
    losses = [row["loss"] for row in report["steps"]]
    data: dict[str, Any] = {"backend": "nccl" if ctx.cuda else "gloo", "ranks": ranks,
                            "world_size": report["world_size"], "num_stages": report["num_stages"], "losses": losses,
                            "reference": _reference(ctx, name, end - time.time())}
    return _judge_equivalence(name, data, rtol=GPU_FP32_RTOL if ctx.cuda else 1e-5, multi_rank=ranks > 1)


def reference_via_subprocess(ctx: Context, name: str, device: str, limit: float,
                             env: dict[str, str] | None) -> list[float] | None:
    """The single-device losses, computed in a child (this driver stays free of CUDA state and hangs)."""
    spec = json.dumps(dataclasses.asdict(TINY))
    argv = [sys.executable, str(Path(__file__).resolve()), "reference", "--workload", spec, "--steps",
            str(EQUIVALENCE_STEPS), "--lr", str(EQUIVALENCE_LR), "--seed", "0", "--device", device]
    ran = run_logged(ctx, name, f"{name}-reference", argv, limit, env)
    return json.loads(ran.stdout) if ran.returncode == 0 else None


def _judge_equivalence(name: str, data: dict[str, Any], *, rtol: float, multi_rank: bool) -> StageResult:
    losses, reference = data["losses"], data["reference"]
    if reference is None:
        return StageResult(name=name, status="fail", detail="the single-device reference run failed", data=data)
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference)]
    data["max_rel_diff"] = max(diffs, default=math.inf)
    problems = []
    if len(losses) != len(reference):
        problems.append(f"{len(losses)} losses for {len(reference)} steps")
    if data["max_rel_diff"] > rtol:
        problems.append(f"losses differ from one device by up to {data['max_rel_diff']:.2e} (tolerance {rtol:g})")
    if multi_rank and data["world_size"] < 2:
        problems.append("the plan uses a single rank")
    where = f"{data['backend']}, plan on {data['world_size']}/{data['ranks']} ranks, {data['num_stages']} stage(s)"
    if problems:
        return StageResult(name=name, status="fail", detail=f"{where}: {'; '.join(problems)}", data=data)
    detail = f"{where}: {len(losses)} losses equal one device's (max rel diff {data['max_rel_diff']:.1e})"
    return StageResult(name=name, status="pass", detail=detail, data=data)


def vs_torch(ctx: Context, name: str, limit: float, *, workload: Workload) -> StageResult:
    """`vs_torch.py`: graphpipe and torch pipelining on the same chain, micro-batches and schedule, the ranks
    sharing the GPU, interleaved rounds; the samples/s of each and their ratio (a figure, not a pass mark)."""
    rounds, iters = (5, 4) if ctx.cuda else (2, 2)
    argv = [sys.executable, str(HERE / "vs_torch.py"), "--device", ctx.device, "--ranks", str(ctx.shared_ranks),
            "--batch", str(workload.batch), "--options", json.dumps(workload.options), "--rounds", str(rounds),
            "--iters", str(iters)]
    ran = run_logged(ctx, name, name, argv, limit)
    report = _json_or_none(ran.stdout)
    if ran.returncode != 0 or report is None:
        return StageResult(name=name, status="fail", detail=f"vs_torch: {ran.why()}")
    rates = report["samples_per_s"]
    detail = (f"{report['ranks']} ranks sharing {ctx.device}, {report['micro_batches']} micro-batches of "
              f"{report['batch'] // report['micro_batches']}, 1F1B: graphpipe {rates['graphpipe']['median']:.0f} "
              f"samples/s, torch pipelining {rates['torch-pipelining']['median']:.0f} samples/s: "
              f"{report['ratio_graphpipe_to_torch']:.2f}x (median of {rounds} rounds)")
    return StageResult(name=name, status="pass", detail=detail, data={"workload": dataclasses.asdict(workload),
                                                                      "report": report})


def profile_ops(ctx: Context, name: str, limit: float, *, workload: Workload) -> StageResult:
    """`graphpipe profile` on the device: every op's measured forward and backward."""
    costs = ctx.out / f"costs-{workload.name}.json"
    argv = graphpipe_argv("profile", *workload.cli_args(), "--device", ctx.device, "--no-progress", "--json",
                          "-o", str(costs))
    ran = run_logged(ctx, name, name, argv, limit)
    if ran.returncode != 0:
        return StageResult(name=name, status="fail", detail=f"graphpipe profile: {ran.why()}")
    summary = json.loads(ran.stdout)
    totals = summary.get("totals", [])
    largest = totals[-1] if totals else {}
    detail = (f"{summary.get('num_costed_ops')} ops on {summary.get('device')}; micro-batch "
              f"{largest.get('micro_batch_size')}: fwd {largest.get('fwd_ms', 0):.3f} ms, "
              f"bwd {largest.get('bwd_ms', 0):.3f} ms")
    data = {"device": summary.get("device"), "totals": totals, "top_ops": summary.get("top_ops", [])[:5],
            "cost_table": str(costs), "timed_by": summary.get("timed_by")}
    if ctx.cuda and data["timed_by"] != "CUDA events":
        return StageResult(name=name, status="fail", detail=f"{detail}; timed by {data['timed_by']}, not CUDA events",
                           data=data)
    return StageResult(name=name, status="pass", detail=f"{detail}; timed by {data['timed_by']}", data=data)


def throughput(ctx: Context, name: str, limit: float, *, workload: Workload, dtype: str) -> StageResult:
    """`graphpipe train` for ctx.steps steps; median and spread of the step times after the warm-up."""
    ran = run_logged(ctx, name, name, train_argv(workload, ctx.ranks, ctx.steps, "--dtype", dtype, "--log-every", "1"),
                     limit)
    if ran.returncode != 0:
        return StageResult(name=name, status="fail", detail=f"graphpipe train: {ran.why()}")
    report = json.loads(ran.stdout)
    rows = report["steps"]
    data = {"workload": dataclasses.asdict(workload), "dtype": dtype, "ranks": ctx.ranks,
            "world_size": report["world_size"], "num_stages": report["num_stages"], "steps": len(rows),
            "warmup_steps_dropped": ctx.warmup, **step_stats(rows[ctx.warmup:], workload.batch)}
    finite = all(math.isfinite(row["loss"]) for row in rows)
    if len(rows) != ctx.steps or not finite or not data["timed_steps"]:
        return StageResult(name=name, status="fail", detail=f"{len(rows)} steps reported, finite losses: {finite}",
                           data=data)
    detail = (f"{data['world_size']} rank(s): median {data['median_ms']:.2f} ms/step "
              f"(p10-p90 {data['p10_ms']:.2f}-{data['p90_ms']:.2f}), {data['samples_per_s']:.0f} samples/s")
    return StageResult(name=name, status="pass", detail=detail, data=data)


def step_stats(rows: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    """Median and spread of measured step times; the median, not the mean, so one slow step does not move it."""
    times = sorted(row["iteration_s"] * 1e3 for row in rows)
    if not times:
        return {"timed_steps": 0}
    deciles = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else [times[0]] * 9
    median = statistics.median(times)
    peaks = [max(row.get("peak_memory_bytes") or [0]) for row in rows]
    return {"timed_steps": len(times), "median_ms": median, "p10_ms": deciles[0], "p90_ms": deciles[-1],
            "min_ms": times[0], "max_ms": times[-1], "rel_spread_p10_p90": (deciles[-1] - deciles[0]) / median,
            "samples_per_s": batch / median * 1e3, "peak_memory_bytes_max": max(peaks),
            "simulated_iteration_ms": _simulated_ms(rows)}


def _simulated_ms(rows: list[dict[str, Any]]) -> float | None:
    simulated = rows[0].get("simulated_iteration_s")
    return simulated * 1e3 if simulated else None


def plan_stages(ctx: Context) -> list[Stage]:
    """In priority order; the limits add up to less than the budget (`planned_seconds`)."""
    medium = MEDIUM if ctx.cuda else MEDIUM_ON_CPU
    return [
        Stage("cuda-tests", cuda_tests, 40, ("pytest", *NEEDS)),
        Stage("shared-gpu-pipeline", partial(pipeline_equivalence, transport="shared"), 65, NEEDS),
        Stage("shared-gpu-train-fp32", partial(shared_gpu_train, dtype="fp32"), 60, NEEDS),
        Stage("shared-gpu-train-bf16", partial(shared_gpu_train, dtype="bf16"), 40, NEEDS),
        Stage("nccl-pipeline", partial(pipeline_equivalence, transport="nccl"), 50, NEEDS, needs_gpus=2),
        Stage("nccl-train", train_equivalence, 40, NEEDS),
        Stage("vs-torch-pipelining", partial(vs_torch, workload=medium), 60, NEEDS),
        Stage(f"profile-{medium.name}", partial(profile_ops, workload=medium), 30, NEEDS),
        Stage(f"throughput-{medium.name}-fp32", partial(throughput, workload=medium, dtype="fp32"), 30, NEEDS),
        Stage(f"throughput-{medium.name}-bf16", partial(throughput, workload=medium, dtype="bf16"), 30, NEEDS),
    ]


def planned_seconds(stages: list[Stage]) -> float:
    """What the stages may take at most, with run.sh's install and the summary's reserve."""
    return INSTALL_ALLOWANCE_S + sum(stage.limit_s for stage in stages) + RESERVE_S


def run_stage(ctx: Context, stage: Stage, only: set[str]) -> StageResult:
    """One stage within what is left of the budget; a crash of the stage's own code is its failure."""
    skip = _skip_reason(ctx, stage, only)
    if skip:
        say(ctx, f"{stage.name}: SKIP ({skip})")
        return StageResult(name=stage.name, status="skip", detail=skip)
    limit = stage.limit_s
    say(ctx, f"{stage.name}: start (limit {limit:.0f} s)")
    started = time.time()
    try:
        result = stage.run(ctx, stage.name, limit)
    except Exception as err:  # unreadable output, say: this stage fails, the others still run
        result = StageResult(name=stage.name, status="fail", detail=f"{type(err).__name__}: {err}")
    result.seconds = time.time() - started
    result.commands = [command for owner, command in ctx.commands if owner == stage.name]
    say(ctx, f"{stage.name}: {result.status.upper()} in {result.seconds:.1f} s: {result.detail}")
    return result


def _skip_reason(ctx: Context, stage: Stage, only: set[str]) -> str | None:
    if only and stage.name not in only:
        return "not in GPU_CHECK_ONLY"
    missing = [name for name in stage.needs if name in ctx.missing]
    if missing:
        return f"needs {', '.join(missing)}, which this Python lacks"
    if ctx.cuda and ctx.gpus < stage.needs_gpus:
        return f"needs {stage.needs_gpus} GPUs, this machine has {ctx.gpus}: multi-rank NCCL: not tested"
    if ctx.left() < stage.limit_s:  # started, it could be cut short by the budget: listed instead
        return (f"does not fit the time budget: its limit is {stage.limit_s:.0f} s, {max(ctx.left(), 0):.0f} s "
                f"are left of GPU_CHECK_BUDGET_S={BUDGET_S:.0f}")
    return None


# ---- the report --------------------------------------------------------------------------------
def environment(ctx: Context) -> dict[str, Any]:
    """What the numbers were measured on."""
    gpus = []
    for index in range(ctx.gpus):
        props = torch.cuda.get_device_properties(index)
        gpus.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                     "capability": f"{props.major}.{props.minor}"})
    return {"mode": "cuda" if ctx.cuda else "cpu-rehearsal (GPU_CHECK_ALLOW_CPU=1)", "host": platform.node(),
            "python": sys.executable, "python_version": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "nccl": _nccl_version(), "gpus": gpus, "device_ranks": ctx.ranks,
            "shared_ranks": ctx.shared_ranks, "cpu_count": os.cpu_count(), "missing_packages": sorted(ctx.missing),
            "install": os.environ.get("GPU_CHECK_INSTALL", "not run through run.sh"), "nvidia_smi": _nvidia_smi(),
            "budget_s": BUDGET_S}


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _nvidia_smi() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def write_summary(ctx: Context, env: dict[str, Any], results: list[StageResult], exit_code: int) -> Path:
    tests = {key: sum(r.data.get("tests", {}).get(key, 0) for r in results)
             for key in ("passed", "failed", "errors", "skipped")}
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "skip")}
    summary = {"started_utc": dt.datetime.fromtimestamp(ctx.start, dt.timezone.utc).isoformat(timespec="seconds"),
               "wall_s": round(ctx.elapsed(), 1), "exit_code": exit_code, "environment": env, "stages": counts,
               "tests": tests, "multi_rank_nccl": multi_rank_nccl(ctx, results),
               "skipped": {r.name: r.detail for r in results if r.status == "skip"},
               "results": [dataclasses.asdict(r) for r in results]}
    (ctx.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (ctx.out / "summary.md").write_text(render_markdown(summary))
    return ctx.out / "summary.md"


def multi_rank_nccl(ctx: Context, results: list[StageResult]) -> str:
    """Whether NCCL ran between several ranks (nccl-pipeline), in words for the summary."""
    stage = next((r for r in results if r.name == "nccl-pipeline"), None)
    if not ctx.cuda:
        return "not tested (CPU rehearsal: the nccl stages ran over gloo)"
    if stage is None or stage.status == "skip":
        return f"not tested ({stage.detail.split(':', 1)[0] if stage else 'no such stage'}; {ctx.gpus} GPU(s))"
    return f"tested, {stage.data.get('ranks', '?')} ranks: {stage.status}"


def render_markdown(summary: dict[str, Any]) -> str:
    env, results = summary["environment"], summary["results"]
    gpus = "; ".join(f"{g['name']} ({g['memory_gib']} GiB, sm {g['capability']})" for g in env["gpus"]) or "none"
    lines = [f"# graphpipe GPU check, {summary['started_utc']}", "",
             f"- mode: {env['mode']}; exit code {summary['exit_code']}; wall {summary['wall_s']} s",
             f"- torch {env['torch']}, CUDA {env['cuda']}, NCCL {env['nccl']}; Python {env['python_version']} "
             f"({env['python']})",
             f"- GPUs: {gpus}; NCCL ranks (a GPU each): {env['device_ranks']}, ranks sharing a GPU: "
             f"{env['shared_ranks']}",
             f"- multi-rank NCCL: {summary['multi_rank_nccl']}",
             f"- graphpipe: {env['install']}; missing packages: {', '.join(env['missing_packages']) or 'none'}",
             f"- stages: {summary['stages']['pass']} passed, {summary['stages']['fail']} failed, "
             f"{summary['stages']['skip']} skipped; tests: {counts_text(summary['tests'])}", "",
             "| stage | result | seconds | detail |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['status']} | {r['seconds']:.1f} | {r['detail']} |" for r in results]
    if summary["skipped"]:
        lines += ["", "Skipped (not failed): " + "; ".join(f"{k}: {v}" for k, v in summary["skipped"].items())]
    lines += _throughput_table(results)
    lines += ["", "## Commands", ""]
    lines += [f"- {r['name']}: `{command}`" for r in results for command in r["commands"]]
    return "\n".join(lines) + "\n"


def _throughput_table(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r["name"].startswith("throughput-") and r["data"].get("timed_steps")]
    if not rows:
        return []
    lines = ["", "## Throughput (steps after the warm-up)", "",
             "| stage | ranks | batch | median ms | p10-p90 ms | min-max ms | samples/s | peak MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["data"]
        lines.append(f"| {r['name']} | {d['world_size']} | {d['workload']['batch']} | {d['median_ms']:.2f} | "
                     f"{d['p10_ms']:.2f}-{d['p90_ms']:.2f} | {d['min_ms']:.2f}-{d['max_ms']:.2f} | "
                     f"{d['samples_per_s']:.0f} | {d['peak_memory_bytes_max'] / 2**20:.0f} |")
    return lines


# ---- entry points ------------------------------------------------------------------------------
def make_context() -> Context:
    cuda = torch.cuda.is_available()
    start = float(os.environ.get("GPU_CHECK_T0", time.time()))
    stamp = dt.datetime.fromtimestamp(start, dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    root = Path(os.environ.get("GPU_CHECK_OUT", REPO / "benchmarks" / "gpu" / "results"))
    out = root / f"{stamp}-{'cuda' if cuda else 'cpu'}"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    missing = frozenset(name for name in PACKAGES if not _imports(name))
    return Context(cuda=cuda, gpus=torch.cuda.device_count() if cuda else 0, missing=missing, out=out, start=start)


def _imports(name: str) -> bool:
    """Importing, not just finding: a numpy built for another ABI is found but breaks torch.from_numpy."""
    try:
        importlib.import_module(name)
    except Exception:  # ImportError, or whatever a broken build raises on import
        return False
    return True


def check_main() -> int:
    if not torch.cuda.is_available() and not ALLOW_CPU:
        print(f"gpu-check: no CUDA device: torch {torch.__version__} in {sys.executable} reports "
              "torch.cuda.is_available() == False (GPU_CHECK_ALLOW_CPU=1 rehearses on CPU)", file=sys.stderr)
        return 2
    ctx = make_context()
    env = environment(ctx)
    _announce(ctx, env)
    only = {name for name in os.environ.get("GPU_CHECK_ONLY", "").split(",") if name}
    results = [_install_result(), *(run_stage(ctx, stage, only) for stage in plan_stages(ctx))]
    exit_code = 1 if any(r.status == "fail" for r in results) else 0
    path = write_summary(ctx, env, results, exit_code)
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "skip")}
    skipped = [r.name for r in results if r.status == "skip"]
    say(ctx, f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
             f"{' (' + ', '.join(skipped) + ')' if skipped else ''}; multi-rank NCCL: "
             f"{multi_rank_nccl(ctx, results)}; summary: {path}")
    return exit_code


def _announce(ctx: Context, env: dict[str, Any]) -> None:
    gpus = ", ".join(g["name"] for g in env["gpus"]) or "none"
    say(ctx, f"{env['mode']}: torch {env['torch']}, CUDA {env['cuda']}, NCCL {env['nccl']}, GPUs: {gpus}")
    if ctx.cuda and ctx.gpus < 2:
        say(ctx, f"1 GPU: the pipelines run {ctx.shared_ranks} ranks sharing it (gloo, host-staged); NCCL runs one "
                 "rank: multi-rank NCCL: not tested")
    for name in sorted(ctx.missing):
        say(ctx, f"missing package: {name}; the stages that need it are skipped" +
            (" (tests run with --noconftest)" if name == "hypothesis" else ""))
    say(ctx, f"results: {ctx.out}")


def _install_result() -> StageResult:
    """How run.sh made graphpipe importable (it ran before this process)."""
    status = os.environ.get("GPU_CHECK_INSTALL_STATUS", "pass")
    return StageResult(name="install", status=status, detail=os.environ.get("GPU_CHECK_INSTALL", "not via run.sh"),
                       seconds=float(os.environ.get("GPU_CHECK_INSTALL_S", "0")))


def reference_losses(workload: Workload, steps: int, lr: float, seed: int, device: str) -> list[float]:
    """Single-device training with what `graphpipe.train` uses (weights from `seed`, `shuffled_batch`, Adam):
    the losses every pipeline run of the same model must reproduce."""
    from graphpipe.model_inputs import as_model_inputs
    from graphpipe.models import load_model
    from graphpipe.models.zoo_model import to_device
    from graphpipe.train import shuffled_batch

    zoo = load_model(workload.model, workload.preset, batch_size=workload.batch, seed=seed, **workload.options)
    model = zoo.model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = shuffled_batch(zoo, seed, step)
        batch = to_device(zoo._replace(model=model, inputs=inputs, targets=targets), torch.device(device))
        call = as_model_inputs(batch.inputs)
        optimizer.zero_grad(set_to_none=True)
        loss = zoo.loss_fn(model(*call.args, **dict(call.kwargs)), batch.targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def reference_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="check.py reference", description="single-device losses as JSON")
    parser.add_argument("--workload", required=True, help="Workload as JSON")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    workload = Workload(**json.loads(args.workload))
    print(json.dumps(reference_losses(workload, args.steps, args.lr, args.seed, args.device)))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["reference"]:
        return reference_main(argv[1:])
    return check_main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
