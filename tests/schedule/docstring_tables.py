"""Pull the schedule table out of a module docstring, to check it against the generator."""

from __future__ import annotations

import textwrap


def docstring_table(doc: str | None) -> str:
    """The indented block that starts with `stage |`, dedented."""
    assert doc, "module has no docstring"
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("stage |"))
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line)
    return textwrap.dedent("\n".join(block))
