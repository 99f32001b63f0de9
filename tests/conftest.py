"""Shared pytest set-up: one thread per process keeps timings and multi-rank tests predictable."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
