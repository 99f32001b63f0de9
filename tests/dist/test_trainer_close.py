"""`PipelineTrainer` used directly, as README's Python section shows: leaving the `with` block closes the
trainer, which destroys the process groups it made (on gloo its loss all-reduces run in one of them) and so
ends the threads that handled its tensors; the script then destroys its own group and exits the normal way,
0 on every rank. Left to interpreter teardown, such a thread could abort a rank after correct results; that
race is rare, so one clean exit shows the path works (no hang, no error), not that the race is gone. close()
itself and step after it are checked in-process.

Run as a module, this file is the script torchrun starts on each rank.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphpipe as gp
from graphpipe.errors import TrainingError
from graphpipe.runtime.comm import InMemoryHub, InMemoryTransport
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.helpers import Chain, by_target, plan_from, run_threads
from tests.waiting import run_watched

pytestmark = pytest.mark.dist
NPROC = 2
NUM_STEPS = 3
PG_TIMEOUT_S = 30
REPO = Path(__file__).resolve().parents[2]


# ---- on each rank -------------------------------------------------------------------------------
def _readme_run(name: str) -> dict[str, Any]:
    """README's Python section for one zoo model on the local-cpu cluster, trained in a `with` block: the
    losses, and how many process groups the trainer's transport held before and after the block."""
    model, inputs, targets, loss_fn = gp.load_model(name, "tiny")
    graph = gp.capture(model, inputs)
    costs = gp.analytic_costs(graph, device="cpu")
    plan = gp.plan(graph, costs, gp.Cluster.preset("local-cpu", num_devices=NPROC),
                   global_batch_size=int(targets.shape[0]))
    with gp.PipelineTrainer(model, plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3), loss_fn=loss_fn,
                            example_inputs=inputs) as trainer:
        losses = [trainer.step(inputs, targets) for _ in range(NUM_STEPS)]
        held = len(getattr(trainer.transport, "groups", {}))
    return {"losses": losses if plan.world_size > trainer.rank else [],  # an idle rank's nan says nothing
            "groups": [held, len(getattr(trainer.transport, "groups", {}))]}


def main() -> None:
    """Two trainers in a row, mmt on both ranks and toy_diamond on one (rank 1 idles); the script then
    destroys its group and exits the normal way."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
    result = {"rank": torch.distributed.get_rank(), **{name: _readme_run(name) for name in ("mmt", "toy_diamond")}}
    torch.distributed.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)


# ---- the tests ----------------------------------------------------------------------------------
def test_a_script_that_closes_the_trainer_exits_cleanly_on_every_rank() -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}",
               "--max-restarts=0", "--monitor-interval=0.5", "-m", "tests.dist.test_trainer_close"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_watched(command, cwd=REPO, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "terminate called" not in output and "exitcode" not in output, output[-3000:]
    results = {row["rank"]: row for row in (json.loads(line.removeprefix("RESULT "))
                                            for line in done.stdout.splitlines() if line.startswith("RESULT "))}
    assert sorted(results) == list(range(NPROC)), output[-3000:]
    mmt = [results[rank]["mmt"]["losses"] for rank in range(NPROC)]
    assert len(mmt[0]) == NUM_STEPS and mmt[0] == mmt[1] and all(math.isfinite(loss) for loss in mmt[0])
    diamond = results[0]["toy_diamond"]["losses"]
    assert len(diamond) == NUM_STEPS and all(math.isfinite(loss) for loss in diamond)
    for rank in range(NPROC):  # the loss all-reduces ran in a group of the trainer's, gone after the block
        assert results[rank]["mmt"]["groups"] == [1, 0] and results[rank]["toy_diamond"]["groups"] == [1, 0]


class _CountingTransport(InMemoryTransport):
    def __init__(self, inner: InMemoryTransport) -> None:
        super().__init__(inner.hub, inner.rank, inner.device)
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def _trainers() -> tuple[list[PipelineTrainer], list[_CountingTransport], tuple[Any, torch.Tensor]]:
    torch.manual_seed(0)
    model = Chain()
    plan = plan_from(model, by_target([("layers.0", 0), ("layers.1", 0), ("layers", 1), ("head", 1)]),
                     [(0,), (1,)], micro_batch_size=2, global_batch_size=4)
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    transports = [_CountingTransport(hub.transport(rank)) for rank in range(plan.world_size)]
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                loss_fn=nn.functional.mse_loss, transport=transports[rank], rank=rank)
                for rank in range(plan.world_size)]
    return trainers, transports, (torch.randn(4, 8), torch.randn(4, 3))


def test_close_is_idempotent_and_step_after_it_fails_with_the_fix() -> None:
    trainers, transports, (x, y) = _trainers()

    def train_then_close(rank: int) -> float:
        with trainers[rank] as trainer:
            loss = trainer.step(x, y)
        trainer.close()
        return loss

    losses = run_threads(len(trainers), train_then_close)
    assert math.isfinite(losses[0]) and losses[0] == losses[1]
    for trainer, transport in zip(trainers, transports):
        assert trainer.closed
        flushes = transport.flushes
        trainer.close()
        assert transport.flushes == flushes  # the second and third close did nothing
        with pytest.raises(TrainingError, match=r"step after close\(\); make a new PipelineTrainer"):
            trainer.step(x, y)


def test_leaving_with_an_error_closes_without_waiting_for_sends() -> None:
    trainers, transports, _ = _trainers()
    with pytest.raises(RuntimeError, match="boom"), trainers[0]:
        raise RuntimeError("boom")
    assert trainers[0].closed and transports[0].flushes == 0


if __name__ == "__main__":
    main()


def test_the_readme_python_section_runs_as_written(tmp_path: Path) -> None:
    """README.md's Python section, copied as it stands into a script that torchrun starts on 2 ranks (two lines
    added: each rank writes its last loss to a file)."""
    text = (REPO / "README.md").read_text()
    start = text.index("## Python\n\n```python\n") + len("## Python\n\n```python\n")
    script = tmp_path / "readme_snippet.py"
    report = "import os\nopen(f\"loss_{os.environ['RANK']}.txt\", 'w').write(str(float(loss)))\n"
    script.write_text(text[start:text.index("```", start)] + report)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}",
               "--max-restarts=0", "--monitor-interval=0.5", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = run_watched(command, cwd=tmp_path, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    losses = [float((tmp_path / f"loss_{rank}.txt").read_text()) for rank in range(NPROC)]
    assert losses[0] == losses[1] and math.isfinite(losses[0]), output[-3000:]
    assert (tmp_path / "plan.json").is_file()
