"""``ckpt``: the command line of checkpoint_lib.

Every sub-command has ``--help``. Engine-backed commands import their engines lazily, so
``ckpt --help`` works with the core alone.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _cmd_setup(args: argparse.Namespace) -> int:
    from .spark.jars import setup_main

    return setup_main()


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .demo_sim import run_demo

    ok = run_demo(records_per_source=args.records, seed=args.seed)
    print("\nall exactly-once modes reproduced the failure-free result" if ok else "\nMISMATCH")
    return 0 if ok else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    return _cmd_simulate(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckpt",
        description="Exactly-once checkpoints, replay and recovery for Spark pipelines.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("setup", help="fetch the Delta Lake jars into the project cache (idempotent)")
    p.set_defaults(func=_cmd_setup)

    for name, func, text in (
        ("simulate", _cmd_simulate, "run the in-memory simulator in every barrier mode, with a crash"),
        ("demo", _cmd_demo, "the end-to-end demo"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--records", type=int, default=200, help="records per source (default 200)")
        p.add_argument("--seed", type=int, default=7, help="random seed of the schedule (default 7)")
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
