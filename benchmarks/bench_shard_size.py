"""Read speed against shard size: what the default ``shard_bytes`` costs and buys.

The same samples (raw 224x224x3 uint8, what ``fastdata preprocess --size 224`` stores) are
written as shard sets of several shard sizes, then each set is read in full, in the
shard-aware shuffled order training uses (``ShardAwareDistributedSampler``, one rank,
``window_shards=4``), through ``ShardDataset`` and a DataLoader, with a warm page cache.
Reported per size: shards, samples per shard (the unit of shard-aware sampling and of a
per-shard resume), images/s and the ratio to the 1 GiB set measured in the same run.
Smaller shards only help sampling and resume as long as reading stays as fast.

    python benchmarks/bench_shard_size.py [--num-images 3000] [--sizes-mb 16 64 256 1024]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _harness import add_publish_argument, images_per_second, save
from torch.utils.data import DataLoader

from fastdata import ShardDataset, passthrough_collate
from fastdata.datasets.distributed import ShardAwareDistributedSampler
from fastdata.preprocess import PreprocessOptions
from fastdata.preprocess._runner import plan_tasks
from fastdata.preprocess._sources import SourceItem, SourceListing
from fastdata.preprocess._task import build_fields
from fastdata.preprocess.engine import ShardTask
from fastdata.shards import Manifest, ShardWriter, save_manifest

_SIDE = 224


def _samples(count: int) -> np.ndarray:
    """``count`` distinct smooth images (the content does not change raw read speed)."""
    yy, xx = np.mgrid[0:_SIDE, 0:_SIDE]
    base = np.stack([xx, yy, (xx + yy) // 2], axis=-1).astype(np.uint16)
    return np.stack([((base + 7 * i) % 256).astype(np.uint8) for i in range(count)])


def write_set(out: Path, images: np.ndarray, shard_mb: int) -> int:
    """Write ``images`` as a shard set split as ``preprocess`` would at ``shard_mb`` MiB."""
    options = PreprocessOptions(sizes=(_SIDE,), shard_bytes=shard_mb << 20)
    items = [SourceItem(f"/x/{i}.jpg", f"c/{i}.jpg", i % 10) for i in range(len(images))]
    listing = SourceListing("imagefolder", "/x", items, [str(c) for c in range(10)])
    fields = build_fields(listing, options)
    tasks: list[ShardTask] = plan_tasks(listing, fields, options)
    out.mkdir(parents=True)
    infos = []
    for task in tasks:
        with ShardWriter(out / task.file, fields) as writer:
            for item in task.items:
                index = int(item.name[2:-4])
                writer.append({"image": images[index], "label": item.label, "path": item.name})
            infos.append(writer.close())
    save_manifest(out, Manifest(fields=list(fields), shards=infos, class_names=listing.class_names))
    return len(tasks)


def read_rate(path: Path, batch_size: int, workers: int) -> float:
    dataset = ShardDataset(path, ("image", "label"), show_progress=False)
    sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=0)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=passthrough_collate,
    )
    return images_per_second(loader, warm_epochs=1, min_seconds=3.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=3000)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    add_publish_argument(parser)
    args = parser.parse_args()
    images = _samples(args.num_images)
    work = Path(tempfile.mkdtemp(prefix="bench-shard-size-"))
    rows: list[dict[str, Any]] = []
    try:
        for size in args.sizes_mb:
            shards = write_set(work / f"s{size}", images, size)
            rows.append({"shard_mb": size, "shards": shards})
        # read the sets in turn, twice, interleaved, so that drift in machine load
        # touches every size alike; the better of the two passes is reported
        for _ in range(2):
            for row in rows:
                rate = read_rate(work / f"s{row['shard_mb']}", args.batch_size, args.workers)
                row["images_per_s"] = max(row.get("images_per_s", 0.0), rate)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    reference = next((r for r in rows if r["shard_mb"] == 1024), rows[-1])["images_per_s"]
    print(f"{args.num_images} raw {_SIDE}x{_SIDE} samples, batch {args.batch_size}, "
          f"{args.workers} workers, warm page cache")  # fmt: skip
    print("| shard size | shards | samples/shard | images/s | vs 1 GiB |")
    print("|---|---|---|---|---|")
    for row in rows:
        row["samples_per_shard"] = -(-args.num_images // row["shards"])
        row["ratio_vs_1gib"] = row["images_per_s"] / reference
        print(
            f"| {row['shard_mb']} MiB | {row['shards']} | {row['samples_per_shard']} | "
            f"{row['images_per_s']:,.0f} | {row['ratio_vs_1gib']:.2f} |"
        )
    save("shard_size", {"num_images": args.num_images, "batch_size": args.batch_size,
                        "workers": args.workers, "rows": rows}, publish=args.publish)  # fmt: skip


if __name__ == "__main__":
    main()
