"""Run one CLI command module in-process, without the other commands' modules."""

from __future__ import annotations

import argparse
from types import ModuleType


def run_command(module: ModuleType, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="graphpipe")
    module.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))
