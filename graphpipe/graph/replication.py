"""Which ops every stage recomputes instead of receiving: the rule the planner and the runtime share.

Only tensors with the batch as their first dimension can be sent between stages (the runtime
cuts them by sample). Many values of real models are not such tensors: sizes read from an
input (`sym_size`, `x.shape[0]`), position ids from `arange`, attention masks, rotary tables.
They are cheap and depend on nothing but the model inputs and the parameters' storage, so
every stage that reads one computes it itself:

- model inputs (every rank reads the data) and parameter or buffer reads are replicated;
- an op is replicated when all its inputs are, it reads no trainable parameter (its gradient
  would be counted once per copy), it is not random (each copy would draw other numbers) and
  it mutates nothing (`add_`, `copy_`, `x += y`) but a tensor the stage computed itself (a mask
  filled in place: each copy writes its own; `graphpipe.graph.mutation`).

Replicated ops carry no message, order no stages and join no branches. What remains is
either a batch-first tensor (it may cross a stage boundary) or a value that must stay with
its readers (`graphpipe.graph.colocation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from graphpipe.graph.mutation import changes_of, views_of
from graphpipe.graph.op_graph import FREE_KINDS, OpNode

__all__ = ["is_inplace_name", "is_mutating", "is_random", "mark_replicated", "op_base_name", "op_changes",
           "trainable_param_readers"]

_RANDOM_PARTS = ("dropout", "rand", "bernoulli", "multinomial", "normal_", "uniform_", "Dropout")
_INPLACE_OPERATORS = frozenset({"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior",
                                "ixor", "ilshift", "irshift", "imatmul", "setitem"})


def mark_replicated(ops: Sequence[OpNode]) -> tuple[OpNode, ...]:
    """The ops with `replicated` set by the rule above (ops in topological order). A replicated tensor that an
    op which is not replicated writes (a mask filled from an activation) is that op's stage's copy only after
    the write, so the ops that read it later are not replicated either; found by marking again until no such
    reader is left."""
    changes = op_changes(ops)
    kept_out: set[str] = set()
    while True:
        free = _free_ops(ops, changes, kept_out)
        late = _late_readers(ops, changes, free) - kept_out
        if not late:
            break
        kept_out |= late
    return tuple(op if op.replicated == (op.name in free) else replace(op, replicated=op.name in free) for op in ops)


def _free_ops(ops: Sequence[OpNode], changes: dict[str, tuple[str, ...]], kept_out: set[str]) -> set[str]:
    readers = trainable_param_readers(ops)
    kinds = {op.name: op.kind for op in ops}
    free: set[str] = set()
    for op in ops:
        writes_own_copy = op.name in changes and kinds[changes[op.name][-1]] not in FREE_KINDS
        if op.kind in FREE_KINDS or (
                op.kind in ("call_function", "call_method") and op.name not in readers and op.name not in kept_out
                and (writes_own_copy or not is_mutating(op)) and not is_random(op)
                and all(src in free for src in op.inputs)):
            free.add(op.name)
    return free


def _late_readers(ops: Sequence[OpNode], changes: dict[str, tuple[str, ...]], free: set[str]) -> set[str]:
    """Replicated ops that read, after a write that is not replicated, the tensor it writes (or a view)."""
    position = {op.name: idx for idx, op in enumerate(ops)}
    by_name = {op.name: op for op in ops}
    first_readers: dict[str, list[str]] = {}
    for op in ops:
        if op.inputs:
            first_readers.setdefault(op.inputs[0], []).append(op.name)
    late: set[str] = set()
    for writer, chain in changes.items():
        if writer in free or chain[-1] not in free or by_name[chain[-1]].kind in FREE_KINDS:
            continue
        aliases = views_of((chain[-1],), first_readers, lambda name: op_base_name(by_name[name]),
                           lambda name: is_mutating(by_name[name]), skip=writer)
        late |= {op.name for op in ops if op.name in free and position[op.name] > position[writer]
                 and any(src in aliases for src in op.inputs)}
    return late


def trainable_param_readers(ops: Sequence[OpNode]) -> set[str]:
    """Ops that read a parameter with a gradient (owners and the ops it is shared with)."""
    readers: set[str] = set()
    for op in ops:
        for param in op.params:
            if not param.is_buffer:
                readers.add(op.name)
                readers.update(param.shared_with)
    return readers


def is_mutating(op: OpNode) -> bool:
    """An in-place op: its name ends in `_` (`add_`, `relu_`, `copy_`), an augmented assignment, or inplace=True."""
    return op.attrs.get("inplace") is True or is_inplace_name(op_base_name(op))


def is_inplace_name(name: str) -> bool:
    """A function or method name that changes its first argument: `add_`, `relu_`, `iadd`, `setitem`
    (not a private or dunder name such as `_foo_`)."""
    return name in _INPLACE_OPERATORS or (name.endswith("_") and not name.startswith("_"))


def op_changes(ops: Sequence[OpNode]) -> dict[str, tuple[str, ...]]:
    """For every in-place op: the ops whose storage it writes, its own input first, the root last."""
    by_name = {op.name: op for op in ops}
    return changes_of(by_name, lambda name: by_name[name].inputs[0] if by_name[name].inputs else None,
                      lambda name: op_base_name(by_name[name]), lambda name: is_mutating(by_name[name]))


def is_random(op: OpNode) -> bool:
    name = op.module_type or op.target
    return any(part in name for part in _RANDOM_PARTS)


def op_base_name(op: OpNode) -> str:
    name = op.module_type or op.target.rsplit(".", 1)[-1]
    return name.split(".")[0]
