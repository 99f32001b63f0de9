"""The GraphPipe DP (docs/method.md §4): binary search on a TPS target over a DP on the SP tree.

For one micro-batch size b, a probe with target T asks: is there a stage graph with every
stage's TPS <= T that fits in memory on the devices, and which one has the fewest
in-flight samples at its source? The DP answers per SP node with a *need vector*:

    need[v] = fewest devices with which the node can be staged so that its entry stages
              hold at most v micro-batches in flight (v = in-flight samples / b)

given the in-flight count `k_after` of what follows the node. Vectors are non-increasing
in v; combining two parts is adding their vectors, so device splits d = d1 + d2 cost O(v).
The recurrences (base, series and parallel cases) are written out in `probe`, the
fork/join layouts' in `fork_join`.

- Chain (series case), solved from the sink backwards, so downstream in-flight counts
  are known when an upstream stage's memory is checked. A suffix starting at item i either
  starts with a segment [i, j) of items as one stage on d1 devices (d1 divides b: every
  device gets whole samples), whose in-flight count is one more than what follows, or,
  when item i is a parallel block, opens it: the block is solved given the in-flight count
  of the rest of the chain. Any op boundary of a chain can be cut, in O(L^2) per chain of
  L items (segment costs are prefix sums, tabulated per micro-batch size for all segments
  and degrees at once; a probe reads only the segments that fit in memory with TPS within T,
  kept sorted by TPS per start, less the degrees a smaller degree of the same segment
  dominates at T: see `size_tables`).
- Parallel block: its branches are grouped; a group is one branch solved as a chain, or
  several whole branches merged into one stage. The fork's stage takes the larger of the
  branches' in-flight requirements (the max over entries). With up to 4 branches every
  grouping is tried (over counts where the branches are twins whose unions cost alike); with
  more, the branches are sorted by compute and groups are runs of consecutive branches
  (interval partitions), which keeps the DP polynomial.
- Fork and join absorption (`fork_join`): the leaves just before a block with at most 4
  branches may join the first stage of one branch, and the leaves just after it the last
  stage of one branch, so a cheap input or concat + head costs no device.
- The join's stage with the lightest branches (`Probe.joined`): for a block of more than 4
  branches, the leaves just after it may share one stage with the last branches of the sorted
  order (whole), fed by the other branches grouped in runs (DLRM's embeddings with the
  interaction and the top MLP).

Cost of a probe, with n ops, V = devices + 2 in-flight values and D degrees. Every sub-problem
is memoised in the probe by what its answer depends on: a chain suffix by (chain, k_after, end),
a parallel block by (block, k_after), a fork/join block by (its parallel block, the ops of its
fork and join runs, with or without J, k_after) and, without merge layouts, by the options its fork
run gives F's stage instead of F's ops, never by the chain it was met in; and a row does not solve an item
where a floor of its vector (the vector at the rest's breakpoint before, or the block's fork floor) shows that
it could change nothing (`Probe._before`). The chains
solved are the SP tree's, their prefixes cut at merge tails, and the branches with a join run
appended (B_r + [J]); a fork's lane [F] + B_r is never solved itself, only B_r behind F's stage.
So a fork run never travels into the blocks nested inside the branch, and a join run only into
the last block of a branch: a block at nesting depth t has at most f + 1 fork runs (f the
leaves right before it in its own chain) and t + 1 join runs (its own, or merged with those of
the blocks around it). Keyed by chain, with fork lanes solved whole, every extended chain had
re-solved the blocks inside it with new fork and join runs: about 3x the chain tables and
solves per level of nesting, 3-5x the time. Every block content is solved once per k_after and
with or without J: its c^2 + c layouts cost O(V) each, plus O(L·D·B) for F's stage (L the
items of F's lane, B the breakpoints of its rest: about one on the graphs measured, `fork_join`), plus
O(L0·L1·(D + R)) for the merge tails of a two-branch block (R <= V the runs of cells where the
lanes' vectors are all constant: `need.CellRuns`); every chain of L items costs
O(L^2·D·V) at most. Summed over the tree this is polynomial in n, and at a fixed op count it
grows about linearly, not exponentially, with the nesting depth
(`tests/planner/test_nested_branches.py` counts the memo entries and chain tables;
`benchmarks/nested_branches` times it).

The stage graphs this DP can produce are those whose stages are runs of items of one SP
chain (or of an extended chain of fork/join absorption) or unions of whole branches of one
parallel block, possibly with the join's leaves ("SP-aligned" partitions); the exhaustive
baseline checks optimality over that space for blocks of up to 4 branches (`sp_aligned=True`),
and the tests' reference DP and enumeration cover wider blocks too. The search on T (`search`)
keeps an interval [lo, hi] and stops when it is below 1e-3 relative. Uniform micro-batch size
and 1F1B (in-flight = v · b); per-stage sizes are a refinement (`graphpipe.planner.per_stage`).
Sizes and pruning across sizes: see `partition_sp`.

Modules, bottom to top (each imports only those before it; `tests/test_layering.py` forbids cycles):

    blocks       constants (BIG, branch limits) and the fork/join blocks of a chain (structure only)
    tables       per tree: ChainInfo (prefix sums, boundary traffic), ParInfo, ChainTables (by index)
    size_tables  per micro-batch size: segment arrays, offers, merged-group and run options, degrees
    need         need-vector helpers, the chain step (write, settle), typed choice records, solutions
    rows         a chain row where items start, written as lists or, with many cells, as arrays
    merge_boundary  a merge stage's traffic on every pair of tails of a two-branch block
    merge_tails  merge stages' tables per size, and the prefix floors and needs that prune them
    band         the chain pass's floor over the segments within a target (`Search.may_meet`)
    runs         the parallel DP of a block of many branches over runs of its sorted branches, as arrays
    fork_join    fork/join layouts and their solver, typed against the probe's Protocol
    probe        one DP run at a target: chains, parallel blocks, reconstruction of the stages
    search       the search on the target per size, `partition_sp`, the caches that outlive a call
"""

from graphpipe.planner.sp_dp.blocks import MAX_ENUMERATED_BRANCHES, MERGE_BRANCHES, ForkJoin, fork_join_items
from graphpipe.planner.sp_dp.probe import Probe
from graphpipe.planner.sp_dp.search import TOLERANCE, ModelMemo, Search, partition_sp
from graphpipe.planner.sp_dp.size_tables import divisors_up_to
from graphpipe.planner.sp_dp.tables import ChainInfo, build_tables

__all__ = [
    "MAX_ENUMERATED_BRANCHES",
    "MERGE_BRANCHES",
    "TOLERANCE",
    "ChainInfo",
    "ForkJoin",
    "ModelMemo",
    "Probe",
    "Search",
    "build_tables",
    "divisors_up_to",
    "fork_join_items",
    "partition_sp",
]
