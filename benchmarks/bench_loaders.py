"""Loader throughput on the sample dataset: the naive PIL pipeline against fastdata.

Every loader yields batches of 224x224 uint8 images (the naive baseline: float32
normalised, as the seeds' example does, and a uint8 variant) with int64 labels, batch 64,
shuffled; one warm epoch, then timed epochs (at least ``--min-seconds``), in ``--repeats``
round-robin passes over all loaders, the best pass of each kept. All loaders are measured
in the same run, so the ratios compare; absolute figures depend on the load of the
machine. FFCV is not installable here and DALI's CPU pipeline is measured on JPEG decoding
by ``bench_decode.py``: their rows in the table are reference figures for this machine
kind, labelled as such, never measured here.

Usage::

    python benchmarks/bench_loaders.py --num-images 2000 --data /tmp/fdbench

The raw shards are built by this script from the sample JPEGs (resize the shorter side
to 256 with OpenCV INTER_AREA, centre crop 224 or 256) and cached under ``--data``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import add_publish_argument, images_per_second, load_tool, save

from fastdata._codec import decode_image
from fastdata._optional import import_optional
from fastdata._progress import progress
from fastdata.datasets import RAMDataset, ShardDataset, passthrough_collate
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import (
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

# The chart the README shows: replaced only with the tracked results (--publish).
CHART = Path(__file__).resolve().parent / "bench_loaders.png"
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
# Reference figures for this machine kind (2 CPU cores), not measured in this run.
REFERENCES = {"FFCV raw mode (reference)": 2800, "DALI CPU mode (reference)": 840}


class NaiveFolder(Dataset):
    """The seeds' per-sample pipeline: PIL decode, resize 256, centre crop 224, (normalise)."""

    def __init__(self, paths: list[Path], labels: list[int], normalize: bool) -> None:
        self.paths, self.labels, self.normalize = paths, labels, normalize

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[index]) as opened:
            rgb = opened.convert("RGB")
        scale = 256 / min(rgb.size)
        size = (round(rgb.width * scale), round(rgb.height * scale))
        resized = rgb.resize(size, Image.BILINEAR)
        left, top = (resized.width - 224) // 2, (resized.height - 224) // 2
        cropped = resized.crop((left, top, left + 224, top + 224))
        tensor = torch.from_numpy(np.asarray(cropped).copy()).permute(2, 0, 1)
        if self.normalize:
            return (tensor.float() / 255 - MEAN) / STD, self.labels[index]
        return tensor, self.labels[index]


def build_shards(paths: list[Path], labels: list[int], out: Path, side: int) -> Path:
    """Raw ``(side, side, 3)`` uint8 shards of 1000 samples (a stand-in for
    ``fastdata preprocess --resize 256 --center-crop side``)."""
    if (out / "index.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    fields = [
        FieldSpec("image", "array", "uint8", (side, side, 3), "HWC"),
        FieldSpec("label", "array", "int64"),
    ]
    infos = []
    for start in progress(range(0, len(paths), 1000), desc=f"shards {side}", unit="shard"):
        with ShardWriter(out / f"shard-{start // 1000:05d}.h5", fields) as writer:
            for path, label in zip(
                paths[start : start + 1000], labels[start : start + 1000], strict=True
            ):
                image = decode_image(path.read_bytes(), min_side=256, source=str(path))
                resized = Resize(256).apply([image], None, 1)[0]
                writer.append(
                    {"image": CenterCrop(side).apply([resized], None, 1)[0], "label": label}
                )
            infos.append(writer.close())
    save_manifest(out, Manifest(fields=fields, shards=infos, class_names=[]))
    return out


def loaders(
    data: Path, paths: list[Path], labels: list[int], batch: int
) -> list[tuple[str, str, Callable[[], Any]]]:
    """(name, configuration, factory) of every loader measured."""
    raw224 = build_shards(paths, labels, data / f"shards-224-{len(paths)}", 224)
    raw256 = build_shards(paths, labels, data / f"shards-256-{len(paths)}", 256)
    common: dict[str, Any] = {"batch_size": batch, "shuffle": True}
    train = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    eval_ = Compose([Resize(256), CenterCrop(224)])

    def naive(normalize: bool) -> DataLoader:
        return DataLoader(NaiveFolder(paths, labels, normalize), num_workers=2, **common)

    def fast(dataset: Any, workers: int = 0) -> DataLoader:
        return DataLoader(dataset, num_workers=workers, collate_fn=passthrough_collate, **common)

    main, workers, jpeg = (
        "main process, 2 threads",
        "2 workers",
        "RAMDataset JPEG bytes, resize 256 + crop 224",
    )
    rrc = "ShardDataset raw 256 + RRC 224 + flip"
    return [
        ("naive PIL, float normalise", workers, lambda: naive(True)),
        ("naive PIL, uint8", workers, lambda: naive(False)),
        ("ShardDataset raw 224", main, lambda: fast(ShardDataset(raw224, num_threads=2))),
        (
            "ShardDataset raw 224",
            "main process, 1 thread",
            lambda: fast(ShardDataset(raw224, num_threads=1)),
        ),
        ("ShardDataset raw 224", workers, lambda: fast(ShardDataset(raw224), 2)),
        (rrc, main, lambda: fast(ShardDataset(raw256, transform=train, num_threads=2))),
        (rrc, workers, lambda: fast(ShardDataset(raw256, transform=train), 2)),
        (
            "RAMDataset.from_shards raw 224",
            main,
            lambda: fast(RAMDataset.from_shards(raw224, show_progress=False, num_threads=2)),
        ),
        (jpeg, workers, lambda: fast(RAMDataset(paths, labels, eval_, show_progress=False), 2)),
        (
            jpeg,
            main,
            lambda: fast(RAMDataset(paths, labels, eval_, show_progress=False, num_threads=2)),
        ),
    ]


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Horizontal bars of images/s (log scale), references hatched."""
    plt = import_optional("matplotlib.pyplot", "the benchmark chart")
    names = [f"{r['loader']}\n({r['config']})" for r in rows] + list(REFERENCES)
    values = [r["images_per_s"] for r in rows] + list(REFERENCES.values())
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(names) + 1))
    colors = ["#4c72b0" if r["kind"] == "fastdata" else "#999999" for r in rows]
    bars = ax.barh(names, values, color=colors + ["#ffffff"] * len(REFERENCES), edgecolor="black")
    for bar in bars[len(rows) :]:
        bar.set_hatch("//")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("images / s (224x224 uint8 batches of 64; log scale)")
    ax.set_title(
        "DataLoader throughput, 2-core machine\n(hatched: reference figures, not measured here)"
    )
    for bar, value in zip(bars, values, strict=True):
        ax.text(
            value, bar.get_y() + bar.get_height() / 2, f" {value:,.0f}", va="center", fontsize=8
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/fdbench"), help="cache folder")
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3, help="passes per loader (best kept)")
    parser.add_argument("--only", default="", help="measure only loaders whose name has this")
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # loaders under test bring their own parallelism
    cv2.setNumThreads(1)
    sample = load_tool("make_sample_dataset")
    folder = args.data / "sample"
    paths = (
        sample.make_sample_dataset(folder, args.num_images)
        if not _complete(folder, args.num_images)
        else _listing(folder, args.num_images)
    )
    labels = [int(p.parent.name.split("_")[1]) for p in paths]
    selected = [
        (name, config, factory)
        for name, config, factory in loaders(args.data, paths, labels, args.batch_size)
        if args.only in name
    ]
    # Round-robin repeats, the best of each kept: interference from other tenants of a
    # shared machine only ever slows a loader down, and drifts over minutes. Each pass
    # builds its loader afresh and drops it after (one dataset in memory at a time).
    best = [0.0] * len(selected)
    for repeat in range(args.repeats):
        for k, (name, config, factory) in enumerate(selected):
            rate = images_per_second(factory(), min_seconds=args.min_seconds)
            best[k] = max(best[k], rate)
            print(f"[{repeat + 1}/{args.repeats}] {name:48s} {config:26s} {rate:10,.0f} images/s",
                  flush=True)  # fmt: skip
    rows = [
        {
            "loader": name,
            "config": config,
            "images_per_s": rate,
            "kind": "naive" if "naive" in name else "fastdata",
        }
        for (name, config, _), rate in zip(selected, best, strict=True)
    ]
    naive = {r["loader"]: r["images_per_s"] for r in rows if r["kind"] == "naive"}
    base = naive.get("naive PIL, float normalise")
    print("\n| loader | configuration | images/s | vs naive (float) |\n|---|---|---:|---:|")
    for r in rows:
        ratio = f"{r['images_per_s'] / base:.1f}x" if base else "-"
        print(f"| {r['loader']} | {r['config']} | {r['images_per_s']:,.0f} | {ratio} |")
    for name, value in REFERENCES.items():
        print(f"| {name} | - | {value:,} | not measured here |")
    saved = save(
        "loaders",
        {
            "num_images": args.num_images,
            "batch_size": args.batch_size,
            "repeats_best_of": args.repeats,
            "rows": rows,
            "references": REFERENCES,
        },
        partial=bool(args.only),
        publish=args.publish,
    )
    chart(rows, saved.run.with_suffix(".png"))
    if saved.published is not None:
        chart(rows, CHART)
    return 0


def _listing(folder: Path, count: int) -> list[Path]:
    return sorted(folder.glob("class_*/img_*.jpg"), key=lambda p: p.name)[:count]


def _complete(folder: Path, count: int) -> bool:
    return len(_listing(folder, count)) >= count


if __name__ == "__main__":
    sys.exit(main())
