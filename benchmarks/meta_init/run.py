"""Peak memory per rank with meta initialisation, against every rank building the whole model.

    .venv/bin/python benchmarks/meta_init/run.py            # writes results.md next to this file

`big_mlp.py` has 512 MiB of parameters; one rank's budget is a quarter of that (128 MiB),
which a stage's training state must fit: with plain SGD (`--optimizer sgd`), its weights and
their gradients. The plan cuts the model into 8 stages of 4 layers (64 MiB of parameters,
128 MiB of state each). Three runs of `graphpipe train` with that plan, 3 steps each:

- `--init meta`: every rank builds the model without weights and materialises its stage;
- `--init model`: every rank builds the whole model, as before;
- the constant: the same plan on the same graph at width 16 (`--set width=16`), whose
  weights are negligible: what a rank costs without the model (torch, gloo, capture, data).

Each rank's peak resident set must stay within its stage's share + 25% + that rank's constant.
The runs set `MALLOC_MMAP_THRESHOLD_=65536` so that glibc returns freed tensors to the system
and the resident set counts live memory; the meta run is repeated with glibc's default,
whose heap keeps some freed memory (the last column).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GRAPHPIPE = str(Path(sys.executable).parent / "graphpipe")
MODEL = f"{HERE / 'big_mlp.py'}:build"
RANKS = 8
BATCH = 16
MiB = 2**20


def main() -> int:
    plan_path = HERE / "plan8.json"
    # the planner counts Adam's state (4 x parameters): at most 4 layers (256 MiB) fit under 300 MiB
    _run([GRAPHPIPE, "plan", "--model", MODEL, "--cluster", "local-cpu", "--devices", str(RANKS), "--device", "cpu",
          "--memory-limit", "300MiB", "--batch", str(BATCH), "--global-batch", str(BATCH), "--use-all-devices",
          "-o", str(plan_path)])
    plan = json.loads(plan_path.read_text())
    live = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    runs = {name: _train(plan_path, extra, env) for name, extra, env in
            (("meta", ["--init", "meta"], live), ("model", ["--init", "model"], live),
             ("constant", ["--init", "meta", "--set", "width=16"], live),
             ("meta_default_malloc", ["--init", "meta"], dict(os.environ)))}
    shares = [2 * _stage_param_bytes(stage) for stage in plan["stages"]]
    table = _table(shares, runs)
    (HERE / "results.md").write_text(table)
    print(table)
    return 0 if all(peak <= 1.25 * share + const for share, peak, const in
                    zip(shares, runs["meta"]["peaks"], runs["constant"]["peaks"])) else 1


def _stage_param_bytes(stage: dict[str, object]) -> int:
    layers = sum(1 for op in stage["ops"] if str(op).startswith("layers_"))  # type: ignore[attr-defined]
    return layers * (2048 * 2048 + 2048) * 4


def _train(plan_path: Path, extra: list[str], env: dict[str, str]) -> dict[str, object]:
    start = time.monotonic()
    out = _run(env=env, command=[GRAPHPIPE, "train", "--plan", str(plan_path), "--nproc", str(RANKS), "--steps", "3",
                                 "--json", "--timeout", "300", "--optimizer", "sgd", "--lr", "0.1", *extra])
    rows = json.loads(out)["steps"]
    return {"peaks": rows[-1]["peak_memory_bytes"], "losses": [row["loss"] for row in rows],
            "wall_s": time.monotonic() - start}


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    print("$", " ".join(command), file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}")
    return done.stdout


def _table(shares: list[int], runs: dict[str, dict[str, object]]) -> str:
    meta, model, const, default = (runs[name]["peaks"] for name in ("meta", "model", "constant",
                                                                    "meta_default_malloc"))
    lines = ["# Peak memory per rank: meta initialisation", "",
             f"Command: `.venv/bin/python benchmarks/meta_init/run.py` ({RANKS} gloo ranks on this machine's CPU, "
             f"mini-batch {BATCH}, 3 SGD steps). Model: 32 x Linear(2048, 2048), 512 MiB of parameters; a rank's "
             "budget is 128 MiB (a quarter of the parameters), which its stage's state (weights and gradients, "
             "2 x its parameters) fits. Peak = the rank's peak resident set (ru_maxrss).",
             "", "| rank | stage share (MiB) | constant (MiB) | bound: share x 1.25 + constant | --init meta | "
             "--init model | meta within bound | --init meta, default malloc |", "|---|---|---|---|---|---|---|---|"]
    for rank, share in enumerate(shares):
        bound = 1.25 * share + const[rank]  # type: ignore[index]
        lines.append(f"| {rank} | {share / MiB:.0f} | {const[rank] / MiB:.0f} | {bound / MiB:.0f} | "  # type: ignore[index]
                     f"{meta[rank] / MiB:.0f} | {model[rank] / MiB:.0f} | "  # type: ignore[index]
                     f"{'yes' if meta[rank] <= bound else 'NO'} | {default[rank] / MiB:.0f} |")  # type: ignore[index]
    lines += ["", f"Losses (meta): {runs['meta']['losses']}; (model): {runs['model']['losses']}. The two runs start "
              "from different weights (a seed per module name against one seed for the whole model).",
              f"Wall time: meta {runs['meta']['wall_s']:.0f} s, model {runs['model']['wall_s']:.0f} s, "
              f"constant {runs['constant']['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
