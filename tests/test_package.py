"""The package's face: typed (`py.typed`), its public names typed for checkers and loaded lazily at run time."""

from __future__ import annotations

import ast
from pathlib import Path

import graphpipe

PACKAGE = Path(graphpipe.__file__).parent


def test_the_package_says_it_is_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()


def test_type_checkers_see_every_public_name_from_where_it_loads() -> None:
    """The TYPE_CHECKING imports name the same module for each public name as the lazy loader."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    assert typed == graphpipe._EXPORTS
    assert graphpipe.__all__ == sorted(graphpipe._EXPORTS)


def test_public_names_load() -> None:
    for name in graphpipe.__all__:
        assert getattr(graphpipe, name) is not None, name
