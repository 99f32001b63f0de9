"""The search on the TPS target: probes per micro-batch size, sizes pruned against each other.

For one size, `Search` keeps an interval [lo, hi] of targets: lo from `Search.lower_bound_ms`
and failed probes, hi the bottleneck of the best plan found, and stops when it is below
`tolerance` relative. Where hi is likely close to the optimum (a guess from another micro-batch
size, or a coarser search before), it probes just below hi first and widens the step while
probes succeed, so a good guess costs two or three probes instead of a dozen of bisection;
otherwise it bisects. `partition_sp` runs the sizes (see its docstring for the pruning).

What each cache is and who owns it: the per-tree tables (`tables.ChainTables`) and the
fork/join shapes (`fork_join.Shapes`) belong to one `partition_sp` call, as do the segment
arrays that no size changes (`size_tables.ChainConstants`); each size's tables and offers belong
to its `Search`; each probe's memo tables to the `Probe`. What outlives a call, the per-op cost
columns and the lower bounds, belongs to the cost model (`ModelMemo`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from graphpipe.cost.formulas.memory import OPTIMIZER_STATE_FACTOR
from graphpipe.graph.sp import SPChain
from graphpipe.planner.sp_dp.band import Band, chain_band, chain_floor
from graphpipe.planner.sp_dp.fork_join import Shapes
from graphpipe.planner.sp_dp.merge_tails import MergeTables
from graphpipe.planner.sp_dp.probe import Probe
from graphpipe.planner.sp_dp.size_tables import ChainConstants, SegmentOffers, SizeTables
from graphpipe.planner.sp_dp.tables import ChainInfo, ChainTables, ParInfo, build_tables
from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.stage_spec import StageSpec

TOLERANCE = 1e-3
COARSE_TOLERANCE = 5e-2
COARSE_KEEP = 1.05
FIRST_GUESS = 1.6  # optimum / lower bound is 1.2-1.6 on most of the paper's configurations, up to 2.8
CLIMB_STEP = 4.0  # where only a probe with no target found a plan, `Search.start` climbs from the last failed target
CLIMB_STEPS = 4

BoundKey = tuple[int, int, frozenset[str]]  # (micro-batch size, devices, ops)


class ModelMemo:
    """What the searches on one cost model share across `partition_sp` calls: per-op cost columns and the
    sizes' lower bounds.

    The bounds are shared on purpose: a bound is a sum in the op order of the tree that asked first, and
    the chain search of a request (`graphpipe_planner`) reuses the graph-pipeline search's bounds, so it
    starts from the same numbers (and finds the same plans as it always has). `of` keeps the memo on the
    model itself, so it lives exactly as long as the request's model; a caller may own one and pass it to
    `partition_sp` instead."""

    _ATTRIBUTE = "_sp_dp_memo"  # on the model; set with setattr: `vars(model)` would materialise the instance
    # dict, and CPython 3.11 then reads every attribute of the model slower (+14% in `CostModel.stage_cost`)

    def __init__(self) -> None:
        self._columns: dict[tuple[tuple[str, ...], float], tuple[np.ndarray, np.ndarray]] = {}
        self._all: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self._where: dict[tuple[str, ...], np.ndarray] = {}
        self._positions: dict[str, int] | None = None
        self._bounds: dict[BoundKey, float] = {}

    @classmethod
    def of(cls, model: CostModel) -> ModelMemo:
        """The memo held by `model` (created on first use)."""
        memo = getattr(model, cls._ATTRIBUTE, None)
        if not isinstance(memo, ModelMemo):
            memo = cls()
            setattr(model, cls._ATTRIBUTE, memo)
        return memo

    def op_columns(self, model: CostModel, ops: tuple[str, ...],
                   per_device_batch: float) -> tuple[np.ndarray, np.ndarray]:
        """(fwd + bwd ms, activation bytes) of each op at `per_device_batch` samples: every size's lower bound
        and fit test read them on each of its degrees, and sizes share per-device batches."""
        key = (ops, per_device_batch)
        hit = self._columns.get(key)
        if hit is None:
            times, acts = self._every_op(model, per_device_batch)
            where = self._where.get(ops)
            if where is None:
                position = self._position(model)
                where = self._where[ops] = np.array([position[op] for op in ops], dtype=np.intp)
            hit = self._columns[key] = (times[where], acts[where])
        return hit

    def _every_op(self, model: CostModel, per_device_batch: float) -> tuple[np.ndarray, np.ndarray]:
        """(fwd + bwd ms, activation bytes) of every op of the graph, in `graph.names` order: the trees of one
        model (its SP tree, its chain) list the same ops in different orders, and read them from here."""
        hit = self._all.get(per_device_batch)
        if hit is None:
            rows = model.ops_at(per_device_batch)
            hit = self._all[per_device_batch] = (np.array([fwd + bwd for fwd, bwd, _ in rows.values()], dtype=float),
                                                 np.array([act for _, _, act in rows.values()], dtype=float))
        return hit

    def _position(self, model: CostModel) -> dict[str, int]:
        if self._positions is None:
            self._positions = {op: idx for idx, op in enumerate(model.graph.names)}
        return self._positions

    def lower_bound(self, key: BoundKey, compute: Callable[[], float]) -> float:
        """The bound stored under `key`, computed by `compute` the first time."""
        if key not in self._bounds:
            self._bounds[key] = compute()
        return self._bounds[key]


def _walk(guess_ms: float, tolerance: float) -> list[float]:
    """The targets `Search.start` probes up from a guess, until one succeeds: the guess, then above it by
    steps growing from `tolerance` fourfold while they are below 1 (1.05x, 1.2x at 5%)."""
    targets, step = [guess_ms], tolerance
    while step * 4 < 1:
        targets.append(guess_ms * (1 + step))
        step *= 4
    return targets


def _running_sum(values: np.ndarray) -> float:
    """0.0 + values[0] + values[1] + ... added in this order, as a Python loop would (`add.accumulate` is
    sequential, unlike `sum`'s pairwise summation), so the bounds are the same floats."""
    return float(np.add.accumulate(np.concatenate(([0.0], values)))[-1])


class Search:
    """Binary search on the TPS target for one micro-batch size, over that size's tables (shared by its probes).

    A probe reads this search as its `ProbeHost`: `tables`, `merges`, `root`, `shapes` and `offers`."""

    def __init__(self, model: CostModel, tree: SPChain, num_devices: int, micro_batch_size: int,
                 memory_limit: float, chains: ChainTables, pars: Sequence[ParInfo] | None = None,
                 constants: dict[int, ChainConstants] | None = None, shapes: Shapes | None = None,
                 memo: ModelMemo | None = None) -> None:
        """`chains` (and its `pars`, from `build_tables`) are the tree's tables; `constants` and `shapes` are
        shared by the sizes of one call, `memo` by the calls on one model (`ModelMemo.of` by default)."""
        assert chains.root.chain is tree and (pars is None or pars is chains.pars), "tables of another tree"
        self.model = model
        self.tree = tree
        self.chains = chains
        self.root: ChainInfo = chains.root
        self.tables = SizeTables(model, num_devices, micro_batch_size, memory_limit, constants)
        self.shapes = shapes if shapes is not None else Shapes(chains)
        self.merges = MergeTables(self.tables)
        self.memo = memo if memo is not None else ModelMemo.of(model)
        self._offers: dict[int, SegmentOffers] = {}
        self.best: list[StageSpec] = []
        self.lo = self.hi = 0.0
        self.window_top = 0.0  # the largest target the search expects to probe (`offers` builds up to it)
        self.unguided = False  # `start` found its first plan only on its climb or with no target: far from optimum
        self.fell_back = False  # `start` found its first plan on the walk from another size's fallback
        self._lower_bound: float | None = None
        self._band: Band | None = None  # the root chain's band at a ceiling `may_meet` let through (`offers`)

    @property
    def micro_batch_size(self) -> int:
        return self.tables.micro_batch_size

    @property
    def num_devices(self) -> int:
        return self.tables.num_devices

    def offers(self, info: ChainInfo, target_ms: float) -> SegmentOffers:
        """The chain's (segment, degree) offers that `Probe._segment_keys` may need at `target_ms`.

        Built for a window of targets and reused while the targets stay in it: the binary search's
        interval once its lower end is known (`start`), which later probes never leave, else only this
        target (a lone chain-ceiling probe: from the band `may_meet` read at it, where the chain has one, without
        the segment table; a probe with no target: only the offers no smaller degree dominates);
        rebuilt when a target falls outside. Twins share them."""
        hit = self._offers.get(info.content)
        if hit is None or not hit.low <= target_ms <= hit.bound:
            top = max(target_ms, self.hi, self.window_top)
            lone = math.isinf(target_ms) or not 0 < self.lo <= target_ms
            low, bound = (target_ms, target_ms) if lone else (self.lo, top)
            band, self._band = self._band, None  # read once: a probe at another target needs the table
            if band is not None and band.info is info and low == bound == band.target:
                hit = band.offers()
            else:
                hit = self.tables.build_offers(info, low, bound)
            self._offers[info.content] = hit
        return hit

    def probe(self, target_ms: float) -> list[StageSpec] | None:
        probe = Probe(self, target_ms)
        v = probe.best_entry()
        return None if v is None else probe.stages(None, v)

    def bottleneck_ms(self, stages: Sequence[StageSpec]) -> float:
        return max(self.model.stage_cost(st.ops, st.num_devices, st.micro_batch_size).tps_ms for st in stages)

    def lower_bound_ms(self) -> float:
        """No plan beats this (cached): every op's compute on its cheapest data-parallel degree spread over all
        devices, and no less than the costliest op alone on the widest degree (an op is never split)."""
        if self._lower_bound is None:
            key = (self.micro_batch_size, self.num_devices, frozenset(self.tree.ops))
            self._lower_bound = self.memo.lower_bound(key, self._compute_lower_bound)
        return self._lower_bound

    def _compute_lower_bound(self) -> float:
        model, b, degrees, ops = self.model, self.micro_batch_size, self.tables.degrees, self.tree.ops
        cheapest = np.minimum.reduce([self.memo.op_columns(model, ops, b / d)[0] * d for d in degrees])
        costliest = max(0.0, float(np.max(self.memo.op_columns(model, ops, b / degrees[-1])[0], initial=0.0)))
        return max(_running_sum(cheapest) / self.num_devices, costliest) / b

    def may_fit(self) -> bool:
        """False when no plan at this size can fit, whatever its TPS: every device holds its stage's weights,
        gradients and Adam state and at least one micro-batch's activations (split d ways on d devices), so
        all devices together hold at least 4 x all the weights plus every op's activations on its cheapest
        degree. Saves the probes that would find out (the largest sizes on few devices)."""
        model, b, ops, params = self.model, self.micro_batch_size, self.tree.ops, 0.0
        for op in ops:
            params += model.param_bytes[op]
        acts = _running_sum(np.minimum.reduce([self.memo.op_columns(model, ops, b / d)[1] * d
                                               for d in self.tables.degrees]))
        return OPTIMIZER_STATE_FACTOR * params + acts <= self.tables.memory_limit * self.num_devices

    def may_meet(self, target_ms: float) -> bool:
        """False when no plan at this size meets `target_ms`, proven without a probe: the root chain's floor
        (`band.chain_floor`, the DP with every stage holding one micro-batch, its blocks stepped over on their least
        work: never above the DP's need) needs more than the devices at every in-flight count. On a
        chain without parallel items it reads only the segments within the target where they are few (`band`),
        else the segment table a probe builds anyway; either way it skips the offers and the DP's rows."""
        band = chain_band(self.tables, self.root, target_ms)
        if chain_floor(self.tables, self.root, target_ms, band) > self.tables.num_devices:
            return False
        self._band = band  # the lone probe at this target builds its offers from it (`offers`)
        return True

    def attempt(self, target_ms: float) -> bool:
        """One probe; moves `hi` down to the plan found, or `lo` up to the target."""
        found = self.probe(target_ms)
        if found is None:
            self.lo = max(self.lo, target_ms)
            return False
        self.best, self.hi = found, min(target_ms, self.bottleneck_ms(found))
        return True

    def start(self, guess_ms: float | None = None, tolerance: float = COARSE_TOLERANCE,
              far_ms: float | None = None) -> bool:
        """First feasible plan (False: none at this size). The guess (from another size, else FIRST_GUESS
        times the lower bound) is probed, then above it by steps growing from `tolerance` fourfold, then
        from `far_ms` up the same way if that walk stopped below it, and last with no TPS target, which
        tells whether the size has a plan at all. That probe reads only the offers no smaller degree
        dominates (`offers`), and where it finds a plan, the climb probes the highest target that failed
        times 4, 16, 64 and 256, below that plan's bottleneck, so that the first plan and the window of
        offers are within a few times what is known to fail: the plan with no target may be far above
        the optimum (35x on a 128-layer transformer at op level on 1,024 devices), and a window up to it
        holds every segment that fits (2 million offers there, 0.7 GB of them). A close guess brackets
        the optimum in about two probes; a low one costs a few failed probes, which are cheap (few offers
        are within a tight target), where a loose one costs a slow first probe. `far_ms` is where another
        size found its optimum after a walk like this one had failed (`partition_sp`): far above its
        bound, as when devices far outnumber the ops and the bound says little, and then this size's
        optimum is likely near there too; where memory bound that size instead, this size's walk usually
        succeeds first."""
        self.lo = self.lower_bound_ms() * (1 - TOLERANCE)  # set first: `offers` then builds for the whole search
        if guess_ms is None:
            guess_ms = self.lower_bound_ms() * FIRST_GUESS
        self.window_top = guess_ms * (1 + tolerance * 5)  # the first two probes of the walk up
        walk = _walk(guess_ms, tolerance)
        if any(self.attempt(max(target, self.lo)) for target in walk):
            return True
        if far_ms is not None and far_ms > walk[-1]:
            self.fell_back = any(self.attempt(max(target, self.lo)) for target in _walk(far_ms, tolerance))
            if self.fell_back:
                return True
        self.unguided = True
        found = self.probe(math.inf)  # whether the size has a plan at all
        if found is None:
            return False
        worst, failed = self.bottleneck_ms(found), self.lo  # every target up to `failed` found no plan
        climb = [failed * CLIMB_STEP ** step for step in range(1, CLIMB_STEPS + 1)]
        if not any(self.attempt(target) for target in climb if target < worst):
            self.best, self.hi = found, worst
        return True

    def narrow(self, tolerance: float, near_top: bool = True) -> None:
        """Shrink [lo, hi] below `tolerance` relative. When `hi` is likely close to the optimum (`near_top`),
        probe just below it first, with steps growing fourfold while probes succeed: one failed probe
        just below hi ends the search. Never probes below the middle, so it is at worst a bisection
        with a few extra probes."""
        first = 0.95 * tolerance  # a failure there leaves less than `tolerance` to search
        step = first if near_top else 1.0
        while self.hi - self.lo > tolerance * self.hi:
            target = max(self.hi * (1 - step), (self.lo + self.hi) / 2)
            if not self.attempt(target):
                step = 1.0
            elif step < 1 and self.hi < target * (1 - first):
                step = first  # the plan found beats the target by far: start again just below it
            else:
                step *= 4

    def run(self, tolerance: float = TOLERANCE, guess_ms: float | None = None) -> list[StageSpec] | None:
        if not self.start(guess_ms):
            return None
        self.narrow(tolerance, near_top=guess_ms is not None)
        return self.best


def partition_sp(model: CostModel, tree: SPChain, num_devices: int, micro_batch_sizes: Sequence[int],
                 memory_limit: float, tolerance: float = TOLERANCE,
                 ceiling_ms: float | None = None, every_size: bool = False,
                 memo: ModelMemo | None = None,
                 size_done: Callable[[int], None] | None = None) -> dict[int, list[list[StageSpec]]]:
    """Best SP-aligned stage graph per micro-batch size, first in each size's list (sizes with no feasible
    plan are left out).

    Sizes are searched from the largest down. A size whose lower bound (`Search.lower_bound_ms`)
    is already more than COARSE_KEEP above the best bottleneck found is skipped: no plan at
    that size could be among the best. Every other size is searched to COARSE_TOLERANCE,
    starting from a guess: the previous size's optimum scaled by the ratio of the two sizes'
    lower bounds (optimum / lower bound varies little between neighbouring sizes). A size whose
    first plan came only on the climb or with no target (`Search.unguided`: memory binds it, or its
    bound is loose, as with far more devices than ops) is narrowed by bisection, and its ratio is no
    guess for the next size but a fallback, walked up from once the walk from the guess fails:
    where memory bound it, the next size's optimum is usually far below; where the bound was
    loose, near it (mmt with 32 layers per branch at 1,024 devices: 3.7x its bound). Then, best
    first, each size whose proven lower bound is below the best bottleneck found so far is
    narrowed to `tolerance` (the others cannot hold the optimum, and their plans are still
    within COARSE_TOLERANCE of their own). With `every_size` (for a ranking that looks beyond
    TPS, such as `gp.plan`'s by simulation), every size is narrowed to `tolerance`, and each
    size's list also holds, when they differ, the plan the coarse search had found and the plan
    of a probe COARSE_TOLERANCE above the best bottleneck: the DP returns the plan with the
    fewest micro-batches in flight at the source within the target, so a slightly looser target
    often gives a shallower graph with less warm-up, which the simulation may prefer.
    With `ceiling_ms`, only plans whose bottleneck is at most the ceiling are searched for (one
    probe per size when there are none, none when the size's lower bound is above the ceiling or
    its floor says no plan meets it: `Search.may_meet`).
    `memo`: what calls on the same model share (`ModelMemo.of(model)` by default). `size_done` is called with
    each size once its search is over or it is skipped (`PlanRequest.size_steps`: progress).
    """
    chains, pars = build_tables(model, tree)
    constants: dict[int, ChainConstants] = {}
    shapes = Shapes(chains)
    memo = memo if memo is not None else ModelMemo.of(model)
    searches: dict[int, Search] = {}
    finished: dict[int, list[list[StageSpec]]] = {}  # every_size: each size's plans, its tables already freed
    coarse_hi: dict[int, float] = {}  # each size's bottleneck after the coarse search: what the pruning reads
    ratio = far = None
    for size in sorted(micro_batch_sizes, reverse=True):
        searched = _coarse(Search(model, tree, num_devices, size, memory_limit, chains, pars, constants, shapes, memo),
                           min(coarse_hi.values(), default=math.inf), ceiling_ms, ratio, tolerance, far)
        if size_done is not None and (searched is None or not every_size):
            size_done(size)  # with `every_size`, once narrowed below
        if searched is None:
            continue
        search, bound = searched
        coarse_hi[size] = search.hi
        if search.unguided:  # memory binds this size, or its bound is loose: a fallback for the next, not a guess
            far = search.hi / bound
        else:
            ratio = search.hi / bound
        if every_size:
            finished[size] = _every_plan(search, tolerance)
            if size_done is not None:
                size_done(size)
        else:
            searches[size] = search
        del search, searched  # with `every_size`, the next size builds its tables without this one's
    if every_size:
        return {size: finished[size] for size in sorted(finished)}
    return _narrowed(searches, tolerance) if searches else {}


def _coarse(search: Search, best_hi: float, ceiling_ms: float | None, ratio: float | None,
            tolerance: float, far: float | None = None) -> tuple[Search, float] | None:
    """The size's search to COARSE_TOLERANCE and its lower bound, or None when the size is skipped: its lower
    bound is more than COARSE_KEEP above `best_hi`, nothing fits, or no plan beats the ceiling (see
    `partition_sp`). `ratio`: optimum / lower bound at the previous guided size, for the first guess; `far`:
    the same at the last unguided one, probed when the walk up from the guess fails (`Search.start`)."""
    bound = search.lower_bound_ms()
    if bound > best_hi * COARSE_KEEP:
        return None  # even a perfect plan at this size could not be among the best
    if ceiling_ms is not None and bound * (1 - TOLERANCE) > ceiling_ms:
        return None  # no plan at this size has a bottleneck within the ceiling: skip the probe
    if not search.may_fit():
        return None
    if ceiling_ms is not None:
        # the floor, then a lone probe (`offers` builds for this target only)
        if not search.may_meet(ceiling_ms) or not search.attempt(ceiling_ms):
            return None  # nothing at this size beats the ceiling
        search.lo = bound * (1 - TOLERANCE)
    elif not search.start(bound * ratio if ratio is not None else None, far_ms=None if far is None else bound * far):
        return None
    near_top = (ratio is not None or search.fell_back or ceiling_ms is not None) and not search.unguided
    search.narrow(max(tolerance, COARSE_TOLERANCE), near_top=near_top)
    return search, bound


def _every_plan(search: Search, tolerance: float) -> list[list[StageSpec]]:
    """For `every_size`: the size narrowed to `tolerance`, then its coarse plan and a looser probe's (see
    `partition_sp`). Done as soon as the size's coarse search ends, so that its tables (segment arrays per
    degree, offers) are freed before the next size builds its own: the memory of the largest size, not of
    all of them. Each size's narrowing reads only its own search, so the order changes no result."""
    coarse = search.best
    search.narrow(tolerance)
    plans = [search.best]
    looser = search.probe(search.hi * (1 + COARSE_TOLERANCE))
    plans.extend(plan for plan in (coarse, looser) if plan is not None and plan not in plans)
    return plans


def _narrowed(searches: dict[int, Search], tolerance: float) -> dict[int, list[list[StageSpec]]]:
    """Narrow, best first, the sizes that might hold the optimum (a size whose lower end is above the best
    bottleneck found cannot)."""
    best = math.inf
    for search in sorted(searches.values(), key=lambda item: item.hi):
        if search.lo < best:
            search.narrow(tolerance)
            best = min(best, search.hi)
    return {size: [searches[size].best] for size in sorted(searches)}
