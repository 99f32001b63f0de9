"""In-place ops and the tensors they change: an order the graph's data edges do not show.

`mask[:, :, -pad:] = 0` (a `fill_` of a `slice` of `mask`) changes `mask`, and every later reader of
`mask` reads the changed tensor, yet no data edge leads from the `fill_` to those readers. The graph
runs right in its own order; a split graph must keep two promises:

- an in-place op on a tensor that every stage computes for itself (a mask made from the inputs) is
  computed with it, by every stage that computes that tensor (`graphpipe.graph.replication` marks
  it replicated; `changes_of` says which tensor it changes);
- an in-place op on any other tensor shares a stage with the views it changes it through and with
  every op after it that reads the tensor or one of its views (`graphpipe.graph.colocation`).

A tensor's *root* is the op that made its storage: views (`view`, `slice`, `select`, `transpose`, ...)
and in-place ops return their input's storage, so the root is found by walking first inputs back
through them. `reshape`, `flatten` and `contiguous` count as views: they may return one, and a
needless constraint costs less than a lost write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

__all__ = ["VIEW_NAMES", "alias_chain", "changes_of", "views_of"]

VIEW_NAMES = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "contiguous", "slice", "select", "narrow",
    "getitem", "unsqueeze", "squeeze", "expand", "expand_as", "transpose", "permute", "t", "movedim", "swapaxes",
    "as_strided", "diagonal", "unfold", "alias", "detach", "split", "chunk", "unbind", "real", "imag",
    "to", "type", "type_as", "float", "double", "half", "bfloat16", "long", "int", "bool", "cpu", "cuda",
})  # the conversions return their input when it is already what they ask for


def alias_chain(name: str, first_input: Callable[[str], str | None], base_name: Callable[[str], str],
                is_inplace: Callable[[str], bool]) -> tuple[str, ...]:
    """`name` and the ops whose storage it shares, back to the root (the last one): each step follows
    the first input of a view or of an in-place op."""
    chain = [name]
    while base_name(chain[-1]) in VIEW_NAMES or is_inplace(chain[-1]):
        source = first_input(chain[-1])
        if source is None:
            break
        chain.append(source)
    return tuple(chain)


def changes_of(names: Iterable[str], first_input: Callable[[str], str | None], base_name: Callable[[str], str],
               is_inplace: Callable[[str], bool]) -> dict[str, tuple[str, ...]]:
    """For every in-place op among `names`: the ops whose storage it writes, its view chain up to the root
    (the root last), its own input first."""
    found: dict[str, tuple[str, ...]] = {}
    for name in names:
        source = first_input(name) if is_inplace(name) else None
        if source is not None:
            found[name] = alias_chain(source, first_input, base_name, is_inplace)
    return found


def views_of(roots: Iterable[str], readers: Mapping[str, Iterable[str]],
             base_name: Callable[[str], str], is_inplace: Callable[[str], bool], skip: str | None = None) -> set[str]:
    """The roots and every view or in-place result made from them, transitively, not through `skip`
    (`readers`: each op's readers whose first input it is)."""
    found = set(roots)
    stack = list(found)
    while stack:
        for reader in readers.get(stack.pop(), ()):
            if reader != skip and reader not in found and (base_name(reader) in VIEW_NAMES or is_inplace(reader)):
                found.add(reader)
                stack.append(reader)
    return found
