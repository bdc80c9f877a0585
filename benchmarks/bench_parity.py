"""Training parity: does a model trained from fastdata's stored images learn as well as one
trained the torchvision way from the original files, and how much sooner?

A labelled set of real photographs is built once under ``--workdir`` without a download:
the class of an image is the photograph (or half of one) it is a random crop of, taken from
scikit-image's bundled photographs (those ``tools/make_sample_dataset.py`` uses), at
ImageNet-like sizes (``--image-scale`` 1: about 500x375), jittered in brightness, JPEG
quality 90, split 80/20 into ``train/`` and ``val/`` ImageFolders. A tiny CNN is trained for
``--epochs`` from each of these paths, with the same seeds, sample order and crop draws
(each random resized crop and flip is drawn from ``(seed, epoch, sample)``, so the paths
differ in their pixels only):

- ``torchvision``: per-sample PIL decode of the original JPEG files,
  ``RandomResizedCrop`` (torchvision's rule, PIL's antialiased bilinear resize) + flip for
  training, ``Resize`` + ``CenterCrop`` (crop fraction 0.875) for evaluation;
- ``square``: fastdata shards of the centre square at the training size
  (``resize="shorter"``), the batch transforms ``RandomResizedCrop`` + flip, and
  ``Resize`` + ``CenterCrop`` for evaluation;
- ``keep<S>``: fastdata shards of the whole image, shorter side ``S`` (``resize="keep"``),
  the same transforms.

Reported per path: mean (and each seed's) top-1 validation accuracy, training images per
second end to end (loading + forward + backward + step, one thread for everything) and the
loader's share of it, and ratios to the torchvision path.

    python benchmarks/bench_parity.py            # 20 classes x 60 images, 3 epochs, 4 seeds
    python benchmarks/bench_parity.py --quick    # seconds: a smoke run, not a measurement

Results: ``benchmarks/results/runs/parity-<time>.json`` (``--publish``: also
``benchmarks/results/parity.json``).
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from PIL import Image
from torch import nn

from fastdata import ShardDataset, ops
from fastdata._draws import keyed_uniform
from fastdata.datasets._loader import EpochBatch
from fastdata.preprocess import PreprocessOptions, preprocess
from fastdata.transforms import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import add_publish_argument, load_tool, save

# ImageNet-like (width, height) at --image-scale 1
_SIZES = ((500, 375), (375, 500), (500, 333), (480, 360), (333, 500), (500, 400))
# crop and flip draws of run seed s: keyed by (CROP_SEED + s, epoch, sample), likewise flips
CROP_SEED, FLIP_SEED = 1_000, 2_000
EVAL_FRACTION = 0.875  # Resize(crop / 0.875) + CenterCrop(crop), torchvision's recipe
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)

Fetch = Callable[[list[int], int], tuple[torch.Tensor, torch.Tensor]]


# -- the photo set ---------------------------------------------------------------------------
def build_photo_classes(
    root: Path, classes: int, per_class: int, image_scale: float, seed: int = 0
) -> tuple[Path, Path]:
    """``root/train`` and ``root/val`` ImageFolders (``class_XX/NNNN.jpg``): class ``c`` is
    photograph ``c % P`` of the ``P`` bundled ones (its left or right half once every
    photograph has a class), each image a random crop of it (30-80% of its area), resized
    to an ImageNet-like size times ``image_scale``, brightness jittered, JPEG quality 90.
    Built once per set of arguments."""
    train, val = root / "train", root / "val"
    if (root / "done").exists():
        return train, val
    photos = load_tool("make_sample_dataset")._photos()  # BGR uint8
    rng = np.random.default_rng(seed)
    for c in range(classes):
        photo = photos[c % len(photos)]
        half = c // len(photos)
        if classes > len(photos):  # halves: twice as many classes as photographs
            width = photo.shape[1] // 2
            photo = photo[:, half % 2 * width : (half % 2 + 1) * width]
        height, width = photo.shape[:2]
        for k in range(per_class):
            area = height * width * rng.uniform(0.3, 0.8)
            aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            box_w = min(width, round(math.sqrt(area * aspect)))
            box_h = min(height, round(math.sqrt(area / aspect)))
            top = int(rng.integers(0, height - box_h + 1))
            left = int(rng.integers(0, width - box_w + 1))
            out_w, out_h = _SIZES[int(rng.integers(len(_SIZES)))]
            size = (max(8, round(out_w * image_scale)), max(8, round(out_h * image_scale)))
            crop = photo[top : top + box_h, left : left + box_w]
            interpolation = cv2.INTER_AREA if box_w > size[0] else cv2.INTER_LINEAR
            image = cv2.resize(crop, size, interpolation=interpolation).astype(np.float32)
            image = np.clip(image * rng.uniform(0.8, 1.2), 0, 255).astype(np.uint8)
            folder = (val if k % 5 == 4 else train) / f"class_{c:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(image[..., ::-1]).save(buffer, format="JPEG", quality=90)
            (folder / f"{k:04d}.jpg").write_bytes(buffer.getvalue())
    (root / "done").touch()
    return train, val


# -- the torchvision-style path: PIL, per sample --------------------------------------------
def torchvision_box(height: int, width: int, draws: np.ndarray) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (10 tries of an area fraction uniform
    in ``SCALE`` and a ratio log-uniform in ``RATIO``, else the whole image with its ratio
    clamped), taking its random numbers from ``draws`` (``ops.RandomResizedCrop``'s
    columns: 10 areas, 10 ratios, then the placement)."""
    attempts = (len(draws) - 2) // 2
    area = height * width
    for attempt in range(attempts):
        target = area * (SCALE[0] + (SCALE[1] - SCALE[0]) * draws[attempt])
        low, high = math.log(RATIO[0]), math.log(RATIO[1])
        aspect = math.exp(low + (high - low) * draws[attempts + attempt])
        box_w = round(math.sqrt(target * aspect))
        box_h = round(math.sqrt(target / aspect))
        if 0 < box_w <= width and 0 < box_h <= height:
            top = min(math.floor(draws[-2] * (height - box_h + 1)), height - box_h)
            left = min(math.floor(draws[-1] * (width - box_w + 1)), width - box_w)
            return top, left, box_h, box_w
    aspect = width / height
    box_w, box_h = width, height
    if aspect < RATIO[0]:
        box_h = round(width / RATIO[0])
    elif aspect > RATIO[1]:
        box_w = round(height * RATIO[1])
    return (height - box_h) // 2, (width - box_w) // 2, box_h, box_w


def pil_fetch(paths: list[Path], labels: list[int], crop: int, train: bool, seed: int) -> Fetch:
    """Batches the torchvision way: each file opened and decoded by PIL, then (train)
    random resized crop + flip, or (eval) resize of the shorter side + centre crop."""
    draws_per_box = ops.RandomResizedCrop.draws_per_sample
    resize_to = round(crop / EVAL_FRACTION)

    def one(index: int, epoch: int) -> np.ndarray:
        with Image.open(paths[index]) as opened:
            image = opened.convert("RGB")
        width, height = image.size
        if train:
            key = np.array([index])
            draws = keyed_uniform(CROP_SEED + seed, epoch, key, draws_per_box)[0]
            top, left, box_h, box_w = torchvision_box(height, width, draws)
            image = image.resize(
                (crop, crop), Image.Resampling.BILINEAR, box=(left, top, left + box_w, top + box_h)
            )
            if keyed_uniform(FLIP_SEED + seed, epoch, key, 1)[0, 0] < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            scale = resize_to / min(width, height)
            size = (
                (resize_to, int(height * scale))
                if width <= height
                else (int(width * scale), resize_to)
            )
            image = image.resize(size, Image.Resampling.BILINEAR)
            left, top = (size[0] - crop) // 2, (size[1] - crop) // 2
            image = image.crop((left, top, left + crop, top + crop))
        return np.asarray(image)

    def fetch(indices: list[int], epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = np.stack([one(i, epoch) for i in indices])
        images = torch.from_numpy(batch).permute(0, 3, 1, 2)
        return images, torch.tensor([labels[i] for i in indices])

    return fetch


# -- the fastdata paths ----------------------------------------------------------------------
def store(folder: Path, out: Path, side: int, resize: str) -> Path:
    if not (out / "index.json").exists():
        options = PreprocessOptions(sizes=(side,), resize=resize)
        preprocess(folder, out, options=options, show_progress=False)
    return out


def shard_fetch(root: Path, crop: int, train: bool, seed: int) -> Fetch:
    """Batches from shards: the crop transforms over the stored images, one thread."""
    transform = (
        Compose(
            [
                RandomResizedCrop(crop, SCALE, RATIO, seed=CROP_SEED + seed),
                RandomHorizontalFlip(seed=FLIP_SEED + seed),
            ]
        )
        if train
        else Compose([Resize(round(crop / EVAL_FRACTION)), CenterCrop(crop)])
    )
    dataset = ShardDataset(root, fields=("image", "label"), transform=transform, num_threads=1)

    def fetch(indices: list[int], epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = dataset.__getitems__(EpochBatch(indices, epoch))
        return images, labels

    return fetch


def stored_paths(root: Path) -> tuple[list[str], list[int]]:
    """The source files and labels of a shard set, in its sample order."""
    from fastdata.shards import ShardReader  # noqa: PLC0415

    reader = ShardReader(root)
    paths = [bytes(reader.read("path", i)).decode() for i in range(len(reader))]
    labels = [int(reader.read("label", i)) for i in range(len(reader))]
    reader.close()
    return paths, labels


# -- the model and its training --------------------------------------------------------------
def tiny_cnn(classes: int) -> nn.Module:
    def block(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.ReLU(inplace=True),
        )

    # a 4x4 patch stem, then three stride-2 blocks: about 1 M multiply-adds at 64x64
    stem = nn.Sequential(nn.Conv2d(3, 32, 4, stride=4, bias=False), nn.BatchNorm2d(32), nn.ReLU())
    return nn.Sequential(
        stem, block(32, 48), block(48, 96), block(96, 128),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes),
    )  # fmt: skip


def run_path(
    train: Fetch, val: Fetch, *, sizes: tuple[int, int], classes: int, seed: int, args: Any
) -> dict[str, float]:
    """Train a fresh model (seeded) for ``args.epochs`` and evaluate it: accuracy, seconds
    of training (end to end) and of it waiting for batches."""
    torch.manual_seed(seed)
    model = tiny_cnn(classes)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
    steps = args.epochs * math.ceil(sizes[0] / args.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, args.lr, total_steps=steps)
    loss_of = nn.CrossEntropyLoss(label_smoothing=0.1)

    def normalised(images: torch.Tensor) -> torch.Tensor:
        return images.float().div_(127.5).sub_(1.0)

    loading = 0.0
    started = time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        order = np.random.default_rng([seed, epoch]).permutation(sizes[0]).tolist()
        for start in range(0, len(order), args.batch_size):
            fetched = time.perf_counter()
            images, labels = train(order[start : start + args.batch_size], epoch)
            loading += time.perf_counter() - fetched
            loss = loss_of(model(normalised(images)), labels)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
    training = time.perf_counter() - started
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, sizes[1], args.batch_size):
            indices = list(range(start, min(start + args.batch_size, sizes[1])))
            images, labels = val(indices, 0)
            correct += int((model(normalised(images)).argmax(1) == labels).sum())
    return {"accuracy": correct / sizes[1], "train_s": training, "loading_s": loading}


def run(args: Any) -> dict[str, Any]:
    """Build the set and the stores, train every path with every seed; the results."""
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    name = f"photos-{args.classes}x{args.per_class}-scale{args.image_scale}"
    train_dir, val_dir = build_photo_classes(
        args.workdir / name, args.classes, args.per_class, args.image_scale
    )

    def both(label: str, side: int, resize: str) -> tuple[Path, Path]:
        train_root = store(train_dir, args.workdir / name / f"{label}-train", side, resize)
        return train_root, store(val_dir, args.workdir / name / f"{label}-val", side, resize)

    stores = {"square": both(f"square{args.crop}", args.crop, "shorter")}
    for side in args.keep_sides:
        stores[f"keep{side}"] = both(f"keep{side}", side, "keep")
    reference = stores["square"]
    (train_paths, train_labels), (val_paths, val_labels) = (
        stored_paths(reference[0]), stored_paths(reference[1])
    )  # fmt: skip
    train_files = [train_dir / p for p in train_paths]
    val_files = [val_dir / p for p in val_paths]

    def paths(seed: int) -> dict[str, tuple[Fetch, Fetch]]:
        made = {
            "torchvision": (
                pil_fetch(train_files, train_labels, args.crop, True, seed),
                pil_fetch(val_files, val_labels, args.crop, False, seed),
            )
        }
        for key, (train_root, val_root) in stores.items():
            made[key] = (
                shard_fetch(train_root, args.crop, True, seed),
                shard_fetch(val_root, args.crop, False, seed),
            )
        return made

    sizes = (len(train_files), len(val_files))
    per_seed: dict[str, list[dict[str, float]]] = {key: [] for key in ["torchvision", *stores]}
    for seed in range(args.seeds):
        for key, (train, val) in paths(seed).items():  # round robin: the same minutes for all
            outcome = run_path(train, val, sizes=sizes, classes=args.classes, seed=seed, args=args)
            per_seed[key].append(outcome)
            print(f"seed {seed} {key:12s} accuracy {outcome['accuracy']:.3f}  train "
                  f"{outcome['train_s']:.1f} s (loading {outcome['loading_s']:.1f} s)")  # fmt: skip
    summary: dict[str, Any] = {}
    images = sizes[0] * args.epochs
    for key, outcomes in per_seed.items():
        train_s = sum(o["train_s"] for o in outcomes)
        loading_s = sum(o["loading_s"] for o in outcomes)
        summary[key] = {
            "accuracy_mean": round(float(np.mean([o["accuracy"] for o in outcomes])), 4),
            "accuracy_per_seed": [round(o["accuracy"], 4) for o in outcomes],
            "train_images_per_s": round(images * len(outcomes) / train_s, 1),
            "loader_images_per_s": round(images * len(outcomes) / loading_s, 1),
            "stored_mib": None if key == "torchvision" else round(_mib(stores[key][0]), 1),
        }
    base = summary["torchvision"]
    for key, row in summary.items():
        row["accuracy_points_vs_torchvision"] = round(
            100 * (row["accuracy_mean"] - base["accuracy_mean"]), 2
        )
        # per seed, this path's accuracy minus torchvision's (same init, order and draws):
        # the spread says how far the mean difference is from noise
        paired = [
            100 * (mine["accuracy"] - theirs["accuracy"])
            for mine, theirs in zip(per_seed[key], per_seed["torchvision"], strict=True)
        ]
        standard_error = (
            float(np.std(paired, ddof=1) / math.sqrt(len(paired))) if len(paired) > 1 else None
        )
        row["paired_difference_standard_error_points"] = (
            None if standard_error is None else round(standard_error, 2)
        )
        row["end_to_end_speedup_vs_torchvision"] = round(
            row["train_images_per_s"] / base["train_images_per_s"], 2
        )
        row["loader_speedup_vs_torchvision"] = round(
            row["loader_images_per_s"] / base["loader_images_per_s"], 2
        )
    return {
        "classes": args.classes,
        "train_images": sizes[0],
        "val_images": sizes[1],
        "image_scale": args.image_scale,
        "crop": args.crop,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "source_mib": round(sum(p.stat().st_size for p in train_files) / 2**20, 1),
        "paths": summary,
    }


def _mib(root: Path) -> float:
    return sum(p.stat().st_size for p in root.glob("shard-*.h5")) / 2**20


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--per-class", type=int, default=60, help="images per class (1 in 5 val)")
    parser.add_argument("--image-scale", type=float, default=1.0, help="x ImageNet-like sizes")
    parser.add_argument("--crop", type=int, default=64, help="training input side")
    parser.add_argument("--keep-sides", type=int, nargs="+", default=[64, 96],
                        help="shorter sides of the whole-image stores")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--quick", action="store_true", help="a smoke run of seconds")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "fastdata-bench-parity"
    )
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.classes, args.per_class, args.image_scale = 4, 5, 0.25
        args.crop, args.keep_sides, args.epochs, args.seeds = 24, [24], 1, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    results = run(args)
    print(f"[{results['classes']} classes, {results['train_images']} train / "
          f"{results['val_images']} val images, crop {results['crop']}, {results['epochs']} "
          f"epochs, {results['seeds']} seeds, one thread]")  # fmt: skip
    for key, row in results["paths"].items():
        print(f"  {key:12s} accuracy {100 * row['accuracy_mean']:5.1f}% "
              f"({row['accuracy_points_vs_torchvision']:+.1f} points, paired s.e. "
              f"{row['paired_difference_standard_error_points']})  "
              f"{row['train_images_per_s']:7.1f} img/s end to end "
              f"({row['end_to_end_speedup_vs_torchvision']:.2f}x), loader "
              f"{row['loader_speedup_vs_torchvision']:.1f}x")  # fmt: skip
    save("parity", results, partial=args.quick, publish=args.publish)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
