"""The ``fastdata`` command line: argparse subcommands, each in its own module.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (a callable taking the parsed namespace and returning an exit code). The CLI
only parses, calls the public API and prints; nothing in the library imports it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import fastdata
from fastdata.errors import FastDataError

# Subcommand modules, in the order `fastdata --help` lists them.
_SUBCOMMANDS = ("preprocess", "inspect", "verify", "tune")


EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="fastdata", description="Make PyTorch training stop waiting for data."
    )
    parser.add_argument("--version", action="version", version=f"fastdata {fastdata.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        importlib.import_module(f"fastdata.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastdata`` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except FastDataError as exc:
        print(f"fastdata {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"fastdata {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
