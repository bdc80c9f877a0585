"""`make demo`: the main job on the built-in sample dataset, with what it measured.

1. generate ImageNet-like sample JPEGs (``demo-data/sample-N``, reused on later runs);
2. ``fastdata preprocess`` them into raw 224x224 uint8 shards (``demo-data/shards-224``);
3. read the shards back through a standard ``torch.utils.data.DataLoader``;
4. print preprocess images/s and loader images/s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastdata import ShardReader
from fastdata._system import usable_cpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sample_dataset import ensure_sample_dataset

REPO_ROOT = Path(__file__).resolve().parents[1]


class _ShardImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Minimal map-style dataset over a shard set: ``(H, W, C)`` uint8 image, int64 label.
    ``__getitems__`` lets the DataLoader fetch a whole batch in one batched read."""

    def __init__(self, root: Path) -> None:
        self.reader = ShardReader(root)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = torch.from_numpy(self.reader.read("image", index))
        return image, torch.tensor(int(self.reader.read("label", index)))

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images = self.reader.read_batch("image", indices)
        labels = self.reader.read_batch("label", indices)
        return torch.from_numpy(np.asarray(images)), torch.from_numpy(np.asarray(labels))


def _identity(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


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

    dataset = _ShardImages(out)
    loader = DataLoader(
        dataset,
        batch_size=128,
        shuffle=True,
        num_workers=workers,
        collate_fn=_identity,
        persistent_workers=False,
    )
    started = time.perf_counter()
    seen = 0
    for images, labels in loader:
        if images.dtype != torch.uint8 or images.shape[1:] != (224, 224, 3):
            raise RuntimeError(f"unexpected batch {images.dtype} {tuple(images.shape)}")
        seen += len(labels)
    loader_s = time.perf_counter() - started
    print(
        f"[3/3] DataLoader ({workers} workers, batch 128, shuffled, uint8): "
        f"{seen} images in {loader_s:.2f} s = {seen / loader_s:,.0f} images/s"
    )


if __name__ == "__main__":
    main()
