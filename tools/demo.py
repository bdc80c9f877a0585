"""`make demo`: the main job on the built-in sample dataset, with what it measured.

1. generate ImageNet-like sample JPEGs (``demo-data/sample-N``, reused on later runs);
2. ``fastdata preprocess`` them into raw 224x224 uint8 shards (``demo-data/shards-224``);
3. read them back with ``ShardDataset`` through a standard ``torch.utils.data.DataLoader``
   in the configuration fastdata recommends for raw pixels on this machine: batched reads
   in the main process with a thread pool (``num_workers=0``), one warm epoch, one timed;
4. print preprocess images/s and loader images/s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from fastdata import ShardDataset, load_manifest, passthrough_collate
from fastdata._system import usable_cpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sample_dataset import ensure_sample_dataset

REPO_ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=3000)
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "demo-data")
    args = parser.parse_args()
    workers = usable_cpus()

    started = time.perf_counter()
    src = ensure_sample_dataset(args.data / f"sample-{args.num_images}", args.num_images)
    print(
        f"[1/3] sample dataset: {args.num_images} JPEGs in {src} "
        f"({time.perf_counter() - started:.1f} s)",
        flush=True,
    )

    out = args.data / "shards-224"
    command = [
        sys.executable,
        "-m",
        "fastdata",
        "preprocess",
        str(src),
        str(out),
        "--size",
        "224",
        "--overwrite",
        "--workers",
        str(workers),
    ]
    print("[2/3] " + " ".join(["fastdata", *command[3:]]), flush=True)
    subprocess.run(command, check=True)

    dataset = ShardDataset(out)  # (B, C, H, W) uint8 batches, int64 labels
    loader = DataLoader(
        dataset, batch_size=128, shuffle=True, num_workers=0, collate_fn=passthrough_collate
    )
    for _ in loader:  # warm epoch: page cache and thread pool
        pass
    started = time.perf_counter()
    seen = 0
    for images, labels in loader:
        if images.dtype != torch.uint8 or images.shape[1:] != (3, 224, 224):
            raise RuntimeError(f"unexpected batch {images.dtype} {tuple(images.shape)}")
        seen += len(labels)
    loader_s = time.perf_counter() - started
    print(
        f"[3/3] ShardDataset + DataLoader (main process, {dataset.num_threads} threads, "
        f"batch 128, shuffled, uint8): {seen} images in {loader_s:.2f} s "
        f"= {seen / loader_s:,.0f} images/s"
    )
    stats = load_manifest(out).stats["image"]
    print(
        "      per-channel mean/std for fastdata.gpu.Normalize.from_manifest: "
        f"{[round(v, 1) for v in stats['mean']]} / {[round(v, 1) for v in stats['std']]}"
    )


if __name__ == "__main__":
    main()
