"""``fastdata verify OUT``: re-check the manifest and every shard (size, SHA-256, and the
structure readers check at open); non-zero exit on any problem."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastdata.cli import EXIT_FAILURE, EXIT_OK
from fastdata.cli._args import QUIET_HELP, HelpFormatter
from fastdata.shards import load_manifest, verify_shards


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="re-check the manifest and every shard's size, SHA-256 and structure",
        description="Re-read every shard file of a shard set: compare its size and SHA-256 with "
        "index.json and check its structure (sample count, dtypes, shapes, job id) against the "
        "manifest. Prints OK, or one line per corrupt or missing shard and exits with 1 "
        "(2 for a usage error).",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("out", help="shard folder written by `fastdata preprocess`")
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    problems = verify_shards(args.out, show_progress=not args.quiet)
    if problems:
        for problem in problems:
            print(f"CORRUPT {problem.file}: {problem.reason}", file=sys.stderr)
        print(f"{len(problems)} shard(s) failed verification", file=sys.stderr)
        return EXIT_FAILURE
    count = len(load_manifest(args.out).shards)
    print(f"OK: {count} shard(s) verified")
    return EXIT_OK
