"""Shared pytest set-up: one thread per process keeps timings and multi-rank tests predictable."""

from __future__ import annotations

import os
import tempfile

from hypothesis import settings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# A calibration of the developer's machine (`graphpipe calibrate`) would change every local-cpu plan: the tests
# see none: a folder that is not there (the variable reaches the workers they start too).
os.environ["GRAPHPIPE_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"graphpipe-tests-{os.getpid()}-no-cache")

# CI runs the same examples every time, so a red run is reproducible; locally they vary.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
