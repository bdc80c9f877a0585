"""``fastdata tune PATH --batch-size N``: measure the DataLoader settings of a shard set."""

from __future__ import annotations

import argparse
import re
import time
from typing import TYPE_CHECKING, Any

from fastdata.cli._args import (
    QUIET_HELP,
    HelpFormatter,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from fastdata.shards import Manifest, load_manifest

if TYPE_CHECKING:
    from fastdata.datasets import RAMDataset, ShardDataset


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="measure the fastest DataLoader settings for a shard set",
        description=(
            "Measure DataLoader settings (num_workers or in-process threads, prefetch_factor) "
            "on a shard set read with ShardDataset (shuffled batches) and print the table, "
            "the recommendation and why."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("path", help="shard folder written by `fastdata preprocess`")
    parser.add_argument(
        "--batch-size", type=positive_int, required=True, metavar="N", help="samples per batch"
    )
    parser.add_argument(
        "--fields",
        nargs="+",
        help="fields to read (default: the shard set's fields, without `path` and the "
        "extra resolutions of --size S1 S2...)",
    )
    parser.add_argument(
        "--crop",
        type=positive_int,
        metavar="SIZE",
        help="resize the shorter side to SIZE and centre-crop SIZE x SIZE (with --random-crop: "
        "a random resized crop), as training would; needed when the images differ in size "
        "(JPEG sets made with --resize longer)",
    )
    parser.add_argument(
        "--random-crop",
        action="store_true",
        help="with --crop: a random resized crop (the Inception crop) instead of resize + centre",
    )
    parser.add_argument(
        "--in-memory", action="store_true", help="tune RAMDataset.from_shards instead"
    )
    parser.add_argument(
        "--step-ms",
        type=non_negative_float,
        default=0.0,
        metavar="MS",
        help="simulate a training step of this many milliseconds per batch (0: none)",
    )
    parser.add_argument(
        "--time-budget",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="seconds the search may take",
    )
    parser.add_argument(
        "--ram-budget",
        type=positive_float,
        default=0.5,
        metavar="BUDGET",
        help="host memory the loader may use: a fraction of available memory if <= 1, else bytes",
    )
    parser.add_argument(
        "--max-workers",
        type=non_negative_int,
        metavar="N",
        help="most worker processes (and threads) to try (default: usable CPUs)",
    )
    parser.add_argument("--cache", action="store_true", help="reuse a cached result if any")
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    # The former spelling, still accepted.
    parser.add_argument("--no-progress", dest="quiet", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(func=run, validate=validate)


def validate(args: argparse.Namespace) -> str | None:
    """The option combinations ``tune`` refuses: a message naming them, or ``None``."""
    if args.random_crop and args.crop is None:
        return "--random-crop needs --crop SIZE"
    return None


def default_fields(manifest: Manifest) -> list[str]:
    """The fields a training loop reads: every stored field but ``path`` (the source paths)
    and the extra resolutions (``image_160`` next to ``image``)."""
    names = [spec.name for spec in manifest.fields]
    extra = {
        name
        for name in names
        if (match := re.fullmatch(r"(.+)_(\d+)", name)) and match.group(1) in names
    }
    return [name for name in names if name != "path" and name not in extra]


def run(args: argparse.Namespace) -> int:
    # Imported here: they load torch, and the other subcommands (and --help) need none.
    from fastdata.datasets import RAMDataset, ShardDataset, passthrough_collate  # noqa: PLC0415
    from fastdata.transforms import (  # noqa: PLC0415
        CenterCrop,
        Compose,
        RandomResizedCrop,
        Resize,
    )
    from fastdata.tune import autotune  # noqa: PLC0415

    manifest = load_manifest(args.path)
    fields = args.fields or default_fields(manifest)
    if args.crop is None and manifest.options.get("resize") == "longer":
        raise ValueError(
            f"the images of {args.path} differ in size (preprocessed with --resize longer): "
            "add --crop SIZE to resize and crop them to SIZE x SIZE while tuning"
        )
    transform = None
    if args.crop is not None:
        transform = (
            RandomResizedCrop(args.crop)
            if args.random_crop
            else Compose([Resize(args.crop), CenterCrop(args.crop)])
        )
    progress = not args.quiet
    dataset: ShardDataset | RAMDataset
    if args.in_memory:
        dataset = RAMDataset.from_shards(args.path, fields, transform, show_progress=progress)
    else:
        dataset = ShardDataset(args.path, fields, transform)
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
