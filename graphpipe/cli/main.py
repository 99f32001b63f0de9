"""The `graphpipe` command: argument parsing only; each subcommand lives in its own module.

A command module exposes `add_parser(subparsers)`, which registers its sub-parser and
sets `func(args) -> int` on it. This module imports nothing heavy at its top (torch loads with the
command modules, inside `main`), so a Ctrl-C at any moment of the start-up ends in one line.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from graphpipe.errors import GraphPipeError, ModelLoadError, UsageError

USAGE_EXIT = 2  # what argparse exits with on a bad command line; our own usage errors do the same

# Errors about what the user gave (the command line, an input file, a model spec that does not load) exit like
# argparse's: 2. InputFileError and WeightsError are UsageErrors.
USAGE_ERRORS: tuple[type[GraphPipeError], ...] = (UsageError, ModelLoadError)

COMMAND_MODULES: tuple[str, ...] = (
    "graphpipe.cli.capture_cmd",
    "graphpipe.cli.demo_cmd",
    "graphpipe.cli.profile_cmd", "graphpipe.cli.calibrate_cmd",
    "graphpipe.cli.simulate_cmd", "graphpipe.cli.show_cmd", "graphpipe.cli.compare_cmd",
    "graphpipe.cli.plan_cmd",
    "graphpipe.cli.train_cmd", "graphpipe.cli.plot_log_cmd", "graphpipe.cli.export_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphpipe", description="Graph pipeline parallelism: plan, simulate and train DAGs of stages.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    name = "graphpipe"
    try:
        parser = build_parser()  # imports every command module (and torch): a Ctrl-C may land here
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return USAGE_EXIT
        name = f"graphpipe {args.command}"
        return int(args.func(args) or 0)
    except GraphPipeError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return USAGE_EXIT if isinstance(err, USAGE_ERRORS) else 1
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM/SIGHUP while `train` supervises its workers
        signum = int(getattr(err, "signum", signal.SIGINT))
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"{name}: {how}", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
