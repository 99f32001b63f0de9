"""The first probes of a size's search (`sp_dp.search.Search.start`): the walk up from the guess, the fallback
another size left when its own walk failed, and the probe with no target last."""

from __future__ import annotations

import math

import pytest

from graphpipe.planner.sp_dp.search import Search


class _Size:
    """A size whose plans exist from `optimum` (in units of its lower bound, 1.0) up: `Search.start` over a
    stand-in for the DP's probe that records the targets probed."""

    start = Search.start

    def __init__(self, optimum: float) -> None:
        self.optimum = optimum
        self.probed: list[float] = []
        self.lo = self.window_top = 0.0
        self.unguided = self.fell_back = False

    def lower_bound_ms(self) -> float:
        return 1.0

    def attempt(self, target_ms: float) -> bool:
        self.probed.append(target_ms)
        return target_ms >= self.optimum


def test_a_size_beyond_the_first_guess_is_found_with_no_target() -> None:
    size = _Size(optimum=3.7)
    assert size.start()
    assert size.probed == [1.6, 1.6 * 1.05, 1.6 * 1.2, math.inf] and size.unguided


def test_the_next_size_walks_up_from_the_fallback_and_is_guided() -> None:
    """Another size's optimum at 3.6x its bound, this one's at 3.75x: the walk from the fallback finds it
    two probes later, a finite target near the optimum, so the narrowing starts next to it."""
    size = _Size(optimum=3.75)
    assert size.start(far_ms=3.6)
    assert size.probed == [1.6, 1.6 * 1.05, 1.6 * 1.2, 3.6, 3.6 * 1.05] and size.fell_back and not size.unguided


def test_a_walk_that_succeeds_never_reads_the_fallback() -> None:
    """Where memory bound the other size (its ratio far above this one's), this size's own walk ends first."""
    size = _Size(optimum=1.65)
    assert size.start(far_ms=6.0)
    assert size.probed == [1.6, 1.6 * 1.05] and not (size.fell_back or size.unguided)


@pytest.mark.parametrize(("tolerance", "walk"), [(0.05, [1.0, 1.05, 1.2]), (0.01, [1.0, 1.01, 1.04, 1.16])])
def test_a_fallback_within_the_failed_walk_is_not_probed(tolerance: float, walk: list[float]) -> None:
    """Its target failed already, as everything below the walk's last target did."""
    size = _Size(optimum=9.0)
    assert size.start(guess_ms=2.0, tolerance=tolerance, far_ms=2.0 * 1.15)
    assert size.probed == pytest.approx([2.0 * step for step in walk] + [math.inf]) and size.unguided
