"""``fastdata tune PATH --batch-size N``: measure the DataLoader settings of a shard set."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastdata.datasets import RAMDataset, ShardDataset


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="measure the fastest DataLoader settings for a shard set",
        description=(
            "Measure DataLoader settings (num_workers or in-process threads, prefetch_factor) "
            "on a shard set read with ShardDataset (shuffled batches) and print the table, "
            "the recommendation and why."
        ),
    )
    parser.add_argument("path", help="shard folder written by `fastdata preprocess`")
    parser.add_argument("--batch-size", type=_positive_int, required=True, help="samples per batch")
    parser.add_argument(
        "--fields",
        nargs="+",
        default=["image", "label"],
        help="fields to read (default: image label)",
    )
    parser.add_argument(
        "--in-memory", action="store_true", help="tune RAMDataset.from_shards instead"
    )
    parser.add_argument(
        "--step-ms",
        type=_non_negative_float,
        default=0.0,
        help="simulate a training step of this many milliseconds per batch (default: none)",
    )
    parser.add_argument(
        "--time-budget", type=_positive_float, default=60.0, help="seconds (default 60)"
    )
    parser.add_argument(
        "--ram-budget",
        type=_positive_float,
        default=0.5,
        help="fraction of available memory if <= 1, else bytes (default 0.5)",
    )
    parser.add_argument(
        "--max-workers", type=_non_negative_int, default=None, help="default: usable CPUs"
    )
    parser.add_argument("--cache", action="store_true", help="reuse a cached result if any")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: they load torch, and the other subcommands (and --help) need none.
    from fastdata.datasets import RAMDataset, ShardDataset, passthrough_collate  # noqa: PLC0415
    from fastdata.tune import autotune  # noqa: PLC0415

    progress = not args.no_progress
    dataset: ShardDataset | RAMDataset
    if args.in_memory:
        dataset = RAMDataset.from_shards(args.path, args.fields, show_progress=progress)
    else:
        dataset = ShardDataset(args.path, args.fields)
    step_s = args.step_ms / 1000

    def step(batch: Any) -> None:
        time.sleep(step_s)

    result = autotune(
        dataset,
        args.batch_size,
        step=step if step_s > 0 else None,
        ram_budget=args.ram_budget,
        time_budget_s=args.time_budget,
        max_workers=args.max_workers,
        cache=args.cache,
        progress=progress,
        collate_fn=passthrough_collate,
        shuffle=True,
    )
    print(result.table())
    print()
    settings = ", ".join(f"{k}={v!r}" for k, v in result.recommended_settings().items())
    print(f"recommended   {settings}")
    print(f"why           {result.explanation}")
    return 0
