"""`graphpipe plot-log train.jsonl -o curves.png`: a training log's loss and throughput curves."""

from __future__ import annotations

import argparse
from typing import Any

from graphpipe.cli.common import print_json
from graphpipe.errors import UsageError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plot-log", help="draw a training log's loss and throughput against the step",
        description="Draw the loss, samples/s and, where logged, the learning rate and gradient norm of a "
                    "training log (`graphpipe train --log FILE.jsonl`) against the step, one panel each.")
    parser.add_argument("log", help="JSON lines written by `graphpipe train --log`")
    parser.add_argument("-o", "--output", default="curves.png", metavar="CURVES.png",
                        help="picture to write (.png or .svg; default curves.png)")
    parser.add_argument("--json", action="store_true", help="print a summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphpipe.runtime.training_log import plot_training_log, read_training_log

    rows = read_training_log(args.log)
    try:
        written = plot_training_log(rows, args.output, title=args.log)
    except OSError as err:
        raise UsageError(f"cannot write {args.output}: {err.strerror or err}") from err
    first, last = rows[0], rows[-1]
    if args.json:
        print_json({"steps": len(rows), "first": first, "last": last, "written": written})
        return 0
    print(f"{len(rows)} steps ({first['step']}..{last['step']}): loss {first['loss']:.5g} -> {last['loss']:.5g}")
    print(f"wrote {written}")
    return 0
