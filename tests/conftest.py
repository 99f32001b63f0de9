"""Shared pytest set-up: one thread per process keeps timings and multi-rank tests predictable."""

from __future__ import annotations

import os

from hypothesis import settings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# CI runs the same examples every time, so a red run is reproducible; locally they vary.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
