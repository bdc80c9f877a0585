"""The ``fastdata`` command line: argparse subcommands, each in its own module.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (a callable taking the parsed namespace and returning an exit code) and, where
options depend on each other, ``validate`` (a callable taking the namespace that returns an
error message or ``None``). The CLI only parses, calls the public API and prints; nothing in
the library imports it.

Exit codes: 0 success; 1 the work failed (a corrupt shard, a missing shard set, a missing
optional package, an I/O error); 2 a usage error (a bad option value or combination, also
when the library rejects a value). Either way the error is one line on stderr,
``fastdata <command>: error: ...``; ``--verbose`` adds the traceback. Output into a pipe
that closed (``fastdata inspect OUT | head``) ends the command quietly with 141, as a
Unix tool killed by SIGPIPE ends; Ctrl-C ends it with one line and 130.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence

from fastdata._version import __version__
from fastdata.cli._args import HelpFormatter, Parser
from fastdata.errors import FastDataError

# Subcommand modules, in the order `fastdata --help` lists them.
_SUBCOMMANDS = ("preprocess", "inspect", "verify", "tune")


EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 128 + int(getattr(signal, "SIGPIPE", 13))


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = Parser(
        prog="fastdata",
        description="Make PyTorch training stop waiting for data.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fastdata {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log debug messages; tracebacks on errors"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in _SUBCOMMANDS:
        importlib.import_module(f"fastdata.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastdata`` console script; returns the process exit code."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        if not _stdout_is_broken():
            raise
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    return code


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and getattr(args, "command", None) is None:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    if unknown:
        # Reported by the subcommand, like every other usage error of its options.
        return _error(args, f"unrecognized arguments: {' '.join(unknown)}", EXIT_USAGE)
    validate = getattr(args, "validate", None)
    problem = validate(args) if validate is not None else None
    if problem:
        return _error(args, problem, EXIT_USAGE)
    try:
        return int(args.func(args))
    except BrokenPipeError as exc:
        if _stdout_is_broken():
            raise  # the reader of our output is gone: main() ends quietly
        return _error(args, exc, EXIT_FAILURE)
    except (FastDataError, ModuleNotFoundError, OSError) as exc:
        # Checked first: some library errors about the data are also ValueError/TypeError.
        return _error(args, exc, EXIT_FAILURE)
    except (ValueError, TypeError) as exc:
        # The library validates at its boundary: a value the CLI let through is still a
        # usage error, reported as one.
        return _error(args, exc, EXIT_USAGE)
    except KeyboardInterrupt:
        print(f"fastdata {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _stdout_is_broken() -> bool:
    """Whether stdout is a pipe whose reading end is closed (``| head`` has exited)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # errors and hang-ups are always reported
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() here, or no real stdout
        return True


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of the output
    nobody reads cannot fail at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def _error(args: argparse.Namespace, problem: str | BaseException, code: int) -> int:
    """Report ``problem`` as ``fastdata <command>: error: ...`` on one line; return ``code``."""
    if isinstance(problem, BaseException):
        logging.getLogger("fastdata.cli").debug("traceback", exc_info=problem)
        text = str(problem) or type(problem).__name__
    else:
        text = problem
    one_line = " ".join(text.split())
    print(f"fastdata {args.command}: error: {one_line}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
