"""``fastdata inspect OUT``: print the manifest summary of a shard set."""

from __future__ import annotations

import argparse
from typing import Any

from fastdata._system import format_bytes
from fastdata.cli._args import HelpFormatter
from fastdata.shards import load_manifest


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="print the manifest summary of a shard set",
        description="Print what index.json records about a shard set: sample and shard counts, "
        "size, fields (dtype, shape or encoding), class names, per-channel mean/std, the "
        "source and options it was made from, and the inputs skipped. Reads no shard data.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("out", help="shard folder written by `fastdata preprocess`")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.out)
    print(f"shard set     {args.out}  (format v{manifest.version})")
    print(
        f"samples       {manifest.num_samples} in {len(manifest.shards)} shard(s), "
        f"{format_bytes(manifest.num_bytes)}"
    )
    for spec in manifest.fields:
        print(f"field         {spec.name:<12} {spec.field_kind.describe()}  ({spec.role})")
    if manifest.class_names:
        shown = ", ".join(manifest.class_names[:8])
        more = f" … (+{len(manifest.class_names) - 8})" if len(manifest.class_names) > 8 else ""
        print(f"classes       {len(manifest.class_names)}: {shown}{more}")
    for name, stats in manifest.stats.items():
        mean = ", ".join(f"{v:.2f}" for v in stats.get("mean", []))
        std = ", ".join(f"{v:.2f}" for v in stats.get("std", []))
        print(f"stats         {name}: mean [{mean}] std [{std}] (0-255 scale)")
    if manifest.source:
        print(f"source        {manifest.source}")
    if manifest.options:
        print(f"options       {manifest.options}")
    print(f"skipped       {len(manifest.skipped)}")
    for item in manifest.skipped[:10]:
        print(f"  {item.get('path')}: {item.get('reason')}")
    return 0
