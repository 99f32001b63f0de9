"""The techniques benchmark in its quick form: every configuration recorded, the plot written, and graphpipe with
recomputation and zero-bubble never slower than without."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.scripts import load_script

PNG = b"\x89PNG\r\n\x1a\n"


def test_quick_run_records_every_variant_and_the_choices_never_lose(tmp_path: Path) -> None:
    bench = load_script("techniques/run.py", "techniques_benchmark_run")
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "throughput_vs_memory.png").read_bytes().startswith(PNG)
    for runs in (data["outcomes"], data["sweep"]):
        assert runs and len(runs) % len(bench.VARIANTS) == 0
        for start in range(0, len(runs), len(bench.VARIANTS)):
            plain, chosen = runs[start], runs[start + 1]
            assert (plain["config"]["planner"], plain["config"]["techniques"]) == ("graphpipe", "none")
            if plain["samples_per_s"] is not None:
                assert chosen["samples_per_s"] >= plain["samples_per_s"] * (1 - 1e-9)
