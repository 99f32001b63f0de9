"""The first probes of a size's search (`sp_dp.search.Search.start`): the walk up from the guess, the fallback
another size left when its own walk failed, the probe with no target, and the climb below its plan."""

from __future__ import annotations

import math

import pytest

from graphpipe.planner.sp_dp.search import Search


class _Size:
    """A size whose plans exist from `optimum` (in units of its lower bound, 1.0) up, and whose plan with no target
    has the bottleneck `worst` (None: no plan at all): `Search.start` over stand-ins for the DP's probes that
    record the targets probed."""

    start = Search.start

    def __init__(self, optimum: float, worst: float | None = 1000.0) -> None:
        self.optimum, self.worst = optimum, worst
        self.probed: list[float] = []
        self.lo = self.hi = self.window_top = 0.0
        self.best: list[float] = []
        self.unguided = self.fell_back = False

    def lower_bound_ms(self) -> float:
        return 1.0

    def attempt(self, target_ms: float) -> bool:
        self.probed.append(target_ms)
        if target_ms < self.optimum:
            self.lo = max(self.lo, target_ms)  # as `Search.attempt`: nothing at or below a failed target
            return False
        self.best, self.hi = [target_ms], target_ms
        return True

    def probe(self, target_ms: float) -> list[float] | None:
        assert math.isinf(target_ms), "a plan with a target comes from `attempt`"
        self.probed.append(target_ms)
        return None if self.worst is None else [self.worst]

    @staticmethod
    def bottleneck_ms(plan: list[float]) -> float:
        return plan[0]


FAILED = 1.6 * 1.2  # the walk's last target, the highest that failed


def test_a_size_beyond_the_first_guess_is_found_with_no_target_then_climbs() -> None:
    """Only the probe with no target finds a plan (far above the optimum); the climb from the highest target
    that failed finds one at 4x it."""
    size = _Size(optimum=3.7)
    assert size.start()
    assert size.probed == pytest.approx([1.6, 1.6 * 1.05, FAILED, math.inf, FAILED * 4]) and size.unguided
    assert size.hi == pytest.approx(FAILED * 4)


def test_a_size_with_no_plan_at_all_costs_one_probe_past_the_walk() -> None:
    size = _Size(optimum=math.inf, worst=None)
    assert not size.start()
    assert size.probed == [1.6, 1.6 * 1.05, 1.6 * 1.2, math.inf]


@pytest.mark.parametrize(("optimum", "worst", "climbed"), [(600.0, 1000.0, [4, 16, 64, 256]), (10.0, 12.0, [4])])
def test_a_climb_that_fails_below_the_plan_with_no_target_keeps_that_plan(optimum: float, worst: float,
                                                                           climbed: list[int]) -> None:
    """The climb stops below that plan's bottleneck: a target above it could only find it again."""
    size = _Size(optimum=optimum, worst=worst)
    assert size.start()
    assert size.probed == pytest.approx([1.6, 1.6 * 1.05, FAILED, math.inf] + [FAILED * step for step in climbed])
    assert size.best == [worst] and size.hi == worst and size.unguided


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
    assert size.probed == pytest.approx([2.0 * step for step in walk] + [math.inf, 2.0 * walk[-1] * 4])
    assert size.unguided
