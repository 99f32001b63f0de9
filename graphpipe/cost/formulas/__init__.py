"""The cost formulas, each written once: the planner, its numpy DP, the simulator and the runtime call these.

- `communication`: point-to-point messages between stages and the ring all-reduce of a stage's gradients.
- `time_per_sample`: the one stage-cost rule, a stage's time per sample of the mini-batch (the planner's
  objective), with the per-action overheads and the optimizer step the simulator charges.
- `memory`: static state per device and the most micro-batches a stage can keep in flight.
- `sample_split`: which samples of a micro-batch each rank of a data-parallel stage computes.

A formula the DP evaluates over whole segment tables has a numpy twin beside its scalar version
(`*_array`), with the same operations in the same order, so both give the same numbers.
"""
