"""What a model's own `state_dict` holds, recorded with each checkpoint so that the stages' files give it back.

A stage holds the parameters and buffers its ops read, under the model's names. The model's `state_dict`
differs in two ways: it leaves out non-persistent buffers (a rotary table) that a stage may hold, and it
names a tied weight under every module that holds it (an embedding and the head), where a stage holds it
once, under the first name. `model_keys(model)` records both: the keys of `model.state_dict()` and, for each
key that is another name of an earlier key's tensor, that earlier key. No values are read: it works on a
model built without weights.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["model_keys"]


def model_keys(model: nn.Module) -> dict[str, Any]:
    """{"keys": the model's state_dict keys in order, "aliases": {later name: first name of the same tensor}}."""
    keys = list(model.state_dict(keep_vars=True))
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        if id(tensor) in first and first[id(tensor)] != name:
            aliases[name] = first[id(tensor)]
        else:
            first.setdefault(id(tensor), name)
    kept = set(keys)
    return {"keys": keys, "aliases": {name: source for name, source in aliases.items() if name in kept}}
