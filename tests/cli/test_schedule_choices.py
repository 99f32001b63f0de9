"""Every `--schedule` option offers exactly the schedule registry's names."""

from __future__ import annotations

import argparse

from graphpipe.cli.main import build_parser
from graphpipe.schedule.generate import GENERATORS, SCHEDULE_NAMES
from graphpipe.train import build_parser as build_train_parser


def _schedule_options(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.Action]:
    """`--schedule` of `parser` and of all its sub-parsers, by command path."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if "--schedule" in action.option_strings:
            found[path or parser.prog] = action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_schedule_options(sub, f"{path} {name}".strip()))
    return found


def test_cli_schedule_choices_are_the_registry() -> None:
    options = _schedule_options(build_parser())
    assert {"simulate", "show", "compare", "train"} <= set(options)
    options["python -m graphpipe.train"] = _schedule_options(build_train_parser())["python -m graphpipe.train"]
    for command, option in options.items():
        assert tuple(option.choices or ()) == SCHEDULE_NAMES == tuple(GENERATORS), command
