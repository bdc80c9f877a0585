# ruff: noqa: PLC0415 - each peer is imported where its rows are built (missing: skipped)
"""The timm training recipe from JPEG files and uint8 shards: fastdata against timm's
``create_loader``, torchvision.transforms.v2, albumentations and DALI's CPU pipeline.

Heavy = RandomResizedCrop 224 + flip + RandAugment (n2, m9, mstd 0.5) + RandomErasing 0.25
+ normalize + MixUp/CutMix (alpha 0.8 / 1.0, one of the two per batch, label smoothing
0.1); light = RandomResizedCrop 224 + flip + normalize. Every row reads the same sample
JPEGs (or shards made from them), 2 DataLoader workers (DALI: 2 threads; the shard rows
"threads": no worker process, the dataset's pool of 2 threads, as recommended for raw
shards), batch 64, and
ends with a normalised float32 batch (and soft labels for heavy) in the training
process. Per row: ``--warmup`` untimed batches (the workers start and the batches they
queued meanwhile are drained), then ``--batches`` batches timed, in ``--repeats``
round-robin passes (best kept: other tenants only ever slow a loader down; the range of
the passes is printed too). Each pass also reads the CPU time of the training process and
its workers (DALI: its threads): CPU time per image, which a shared machine's load moves
less than the wall clock, and the same ratios per CPU second.

Peers that do not import are skipped with one line. albumentations has no RandAugment: its
heavy row draws 2 of the same 14 ops (``SomeOf``) at magnitude 9. DALI's heavy row uses
``nvidia.dali.auto_aug.rand_augment`` where it runs on the CPU. MixUp/CutMix for
albumentations and DALI: timm's ``Mixup`` (fastdata's without timm; cheap next to
the rest). One command::

    PYTHONPATH=. python benchmarks/bench_augment.py --num-images 1000

with a Python whose environment has the peers (timm needs torchvision; where the
registry's torchvision does not import beside a CPU torch, see ``shared/tools``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    add_publish_argument,
    best_of_passes,
    images_per,
    load_tool,
    save,
    tree_cpu_seconds,
)
from bench_loaders import build_shards

from fastdata.datasets import RAMDataset, ShardDataset, passthrough_collate
from fastdata.gpu import Normalize
from fastdata.transforms import (
    Compose,
    CutMix,
    MixUp,
    RandAugment,
    RandomChoice,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NUM_CLASSES = 10
WORKERS = 2
Step = Callable[[Any, Any], tuple[Any, Any]]


class Epochs:
    """A loader made once (workers kept), each iteration one epoch of batches passed
    through ``step`` (mixing, normalising) in the training process."""

    def __init__(self, loader: Iterable[Any], step: Step | None = None) -> None:
        self.loader, self.step = loader, step

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for images, targets in self.loader:
            yield self.step(images, targets) if self.step is not None else (images, targets)


Batches = Callable[[], Epochs]


def _loader(dataset: Any, batch: int, **kwargs: Any) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=WORKERS,
        persistent_workers=True,
        **kwargs,
    )


# -- fastdata ----------------------------------------------------------------------------
def fastdata_rows(
    paths: list[Path], labels: list[int], shards: Path, batch: int
) -> dict[str, Batches]:
    normalize = Normalize([255 * m for m in MEAN], [255 * s for s in STD])
    mix = RandomChoice(
        [MixUp(alpha=0.8, num_classes=NUM_CLASSES), CutMix(alpha=1.0, num_classes=NUM_CLASSES)]
    )

    def light() -> Compose:
        return Compose([RandomResizedCrop(224), RandomHorizontalFlip()])

    def heavy() -> Compose:
        return Compose(
            [
                RandomResizedCrop(224),
                RandomHorizontalFlip(),
                RandAugment(num_ops=2, magnitude=9, magnitude_std=0.5),
                RandomErasing(p=0.25),
            ]
        )

    def heavy_step(images: torch.Tensor, targets: torch.Tensor) -> tuple[Any, Any]:
        return mix(images, targets, normalize=normalize)  # mixed and normalized in one pass

    def light_step(images: torch.Tensor, targets: torch.Tensor) -> tuple[Any, Any]:
        return normalize(images), targets

    def epochs(dataset: Any, heavy_row: bool) -> Epochs:
        # what a user writes: the dataset's own loader (its workers reuse the shared memory
        # of batches the loop has let go of)
        loader = dataset.loader(
            batch_size=batch,
            shuffle=True,
            drop_last=True,
            num_workers=WORKERS,
            persistent_workers=True,
        )
        return Epochs(loader, heavy_step if heavy_row else light_step)

    def threaded(dataset: Any, heavy_row: bool) -> Epochs:
        # The configuration recommended for raw shards: no worker processes, the dataset's
        # own thread pool (WORKERS threads) reads and transforms each batch in __getitems__.
        loader = DataLoader(
            dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=0,
            collate_fn=passthrough_collate,
        )  # fmt: skip
        return Epochs(loader, heavy_step if heavy_row else light_step)

    def jpeg(transform: Compose) -> RAMDataset:
        return RAMDataset(paths, labels, transform=transform, show_progress=False)

    def shard(transform: Compose, num_threads: int | None = None) -> ShardDataset:
        return ShardDataset(shards, transform=transform, num_threads=num_threads)

    return {
        "fastdata light, JPEG files": lambda: epochs(jpeg(light()), heavy_row=False),
        "fastdata heavy, JPEG files": lambda: epochs(jpeg(heavy()), heavy_row=True),
        "fastdata light, uint8 shards": lambda: epochs(shard(light()), heavy_row=False),
        "fastdata heavy, uint8 shards": lambda: epochs(shard(heavy()), heavy_row=True),
        "fastdata light, uint8 shards, threads": lambda: threaded(
            shard(light(), WORKERS), heavy_row=False
        ),
        "fastdata heavy, uint8 shards, threads": lambda: threaded(
            shard(heavy(), WORKERS), heavy_row=True
        ),
    }


# -- peers ---------------------------------------------------------------------------------
class Files(Dataset):
    """JPEG files decoded per sample by ``decode`` and transformed by ``transform``."""

    def __init__(
        self,
        paths: list[Path],
        labels: list[int],
        decode: Callable[[Path], Any],
        transform: Callable[[Any], Any],
    ) -> None:
        self.paths, self.labels, self.decode, self.transform = paths, labels, decode, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.transform(self.decode(self.paths[index])), self.labels[index]


def _pil(path: Path) -> Any:
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def _rgb(path: Path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


def _timm_mixup() -> Step:
    """timm's ``Mixup`` (MixUp 0.8 / CutMix 1.0, smoothing 0.1) for the peers without a
    batch mixer of their own; fastdata's where timm is missing."""
    try:
        from timm.data import Mixup
    except ImportError:
        return RandomChoice(
            [MixUp(alpha=0.8, num_classes=NUM_CLASSES), CutMix(alpha=1.0, num_classes=NUM_CLASSES)]
        )
    return Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=NUM_CLASSES)


def timm_rows(folder: Path, batch: int) -> dict[str, Batches]:
    from timm.data import ImageDataset, create_loader

    def run(heavy: bool) -> Epochs:
        loader = create_loader(
            ImageDataset(str(folder)),
            input_size=(3, 224, 224),
            batch_size=batch,
            is_training=True,
            use_prefetcher=False,
            num_workers=WORKERS,
            interpolation="bilinear",
            mean=MEAN,
            std=STD,
            auto_augment="rand-m9-mstd0.5" if heavy else None,
            re_prob=0.25 if heavy else 0.0,
            re_mode="pixel",
            persistent_workers=True,
        )
        return Epochs(loader, _timm_mixup() if heavy else None)

    return {
        "timm create_loader light": lambda: run(False),
        "timm create_loader heavy": lambda: run(True),
    }


def torchvision_rows(paths: list[Path], labels: list[int], batch: int) -> dict[str, Batches]:
    from torchvision.transforms import v2

    def run(heavy: bool) -> Epochs:
        steps: list[Any] = [
            v2.PILToTensor(),
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
        ]
        if heavy:
            steps.append(v2.RandAugment(num_ops=2, magnitude=9))
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
        if heavy:
            steps.append(v2.RandomErasing(p=0.25))
        loader = _loader(Files(paths, labels, _pil, v2.Compose(steps)), batch)
        mix = v2.RandomChoice(
            [
                v2.MixUp(alpha=0.8, num_classes=NUM_CLASSES),
                v2.CutMix(alpha=1.0, num_classes=NUM_CLASSES),
            ]
        )
        return Epochs(loader, mix if heavy else None)

    return {"torchvision v2 light": lambda: run(False), "torchvision v2 heavy": lambda: run(True)}


def albumentations_rows(paths: list[Path], labels: list[int], batch: int) -> dict[str, Batches]:
    import albumentations as album
    from albumentations.pytorch import ToTensorV2

    def run(heavy: bool) -> Epochs:
        steps: list[Any] = [album.RandomResizedCrop(size=(224, 224)), album.HorizontalFlip()]
        if heavy:  # no RandAugment in albumentations: 2 of the same ops at magnitude 9
            steps.append(
                album.SomeOf(
                    [
                        album.Affine(rotate=(-27, 27), p=1),
                        album.Affine(shear={"x": (-16, 16)}, p=1),
                        album.Affine(shear={"y": (-16, 16)}, p=1),
                        album.Affine(translate_percent={"x": (-0.4, 0.4)}, p=1),
                        album.Affine(translate_percent={"y": (-0.4, 0.4)}, p=1),
                        album.Equalize(p=1),
                        album.Solarize(p=1),
                        album.Posterize(num_bits=3, p=1),
                        album.InvertImg(p=1),
                        album.AutoContrast(p=1),
                        album.Sharpen(p=1),
                        album.ColorJitter(brightness=0.8, contrast=0, saturation=0, hue=0, p=1),
                        album.ColorJitter(brightness=0, contrast=0.8, saturation=0, hue=0, p=1),
                        album.ColorJitter(brightness=0, contrast=0, saturation=0.8, hue=0, p=1),
                    ],
                    n=2,
                    p=1,
                )
            )
        steps.append(album.Normalize(MEAN, STD))
        if heavy:
            steps.append(album.Erasing(p=0.25))
        steps.append(ToTensorV2())
        pipeline = album.Compose(steps)
        dataset = Files(paths, labels, _rgb, lambda image: pipeline(image=image)["image"])
        return Epochs(_loader(dataset, batch), _timm_mixup() if heavy else None)

    return {"albumentations light": lambda: run(False), "albumentations heavy": lambda: run(True)}


class _DaliEpochs:
    """A DALI iterator (``auto_reset``) as ``(images, labels)`` batches, epoch after epoch."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for data in self.iterator:
            yield data[0]["images"], data[0]["labels"]


def dali_rows(folder: Path, batch: int) -> dict[str, Batches]:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import rand_augment
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    def run(heavy: bool) -> Epochs:
        @pipeline_def(
            batch_size=batch, num_threads=WORKERS, device_id=None, enable_conditionals=heavy
        )
        def pipe() -> Any:
            jpegs, targets = fn.readers.file(
                file_root=str(folder), random_shuffle=True, name="files"
            )
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_x=224, resize_y=224)
            images = fn.flip(images, horizontal=fn.random.coin_flip())
            if heavy:
                images = rand_augment.rand_augment(images, n=2, m=9, shape=(224, 224))
            images = fn.crop_mirror_normalize(
                images,
                dtype=types.FLOAT,
                output_layout="CHW",
                mean=[255 * m for m in MEAN],
                std=[255 * s for s in STD],
            )
            if heavy:
                images = fn.erase(
                    images,
                    anchor=fn.random.uniform(range=(0, 150), shape=2),
                    shape=(60, 60),
                    axis_names="HW",
                    fill_value=0,
                )
            return images, targets

        built = pipe()
        built.build()
        iterator = DALIGenericIterator(
            built, ["images", "labels"], reader_name="files", auto_reset=True
        )

        def step(images: torch.Tensor, targets: torch.Tensor) -> tuple[Any, Any]:
            labels = targets.view(-1).long()
            return mixing(images, labels) if mixing is not None else (images, labels)

        mixing = _timm_mixup() if heavy else None
        return Epochs(_DaliEpochs(iterator), step)

    return {"DALI CPU light": lambda: run(False), "DALI CPU heavy": lambda: run(True)}


def sample_data(data: Path, num_images: int) -> tuple[Path, list[Path], list[int], Path]:
    """The sample JPEGs (made once under ``data``), their folder, labels, and raw 256x256
    uint8 shards of them."""
    sample = load_tool("make_sample_dataset")
    folder = data / f"augment-{num_images}"
    paths = sorted(folder.glob("class_*/img_*.jpg"))
    if len(paths) < num_images:
        paths = sample.make_sample_dataset(folder, num_images, num_classes=NUM_CLASSES)
    labels = [int(path.parent.name.split("_")[1]) for path in paths]
    shards = build_shards(paths, labels, data / f"augment-shards-256-{len(paths)}", 256)
    return folder, paths, labels, shards


# -- timing --------------------------------------------------------------------------------
def rates(epochs: Epochs, batches: int, warmup: int, min_seconds: float) -> tuple[float, float]:
    """Images per second of wall time and per CPU second (the training process and its
    workers) over ``batches`` batches (more until ``min_seconds`` have passed) after
    ``warmup`` untimed ones."""
    clocks = [time.perf_counter, tree_cpu_seconds]
    wall, cpu = images_per(epochs, batches, warmup, clocks, min_seconds)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/fdbench"), help="cache folder")
    parser.add_argument("--num-images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=10, help="timed batches per pass")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=2.0,
        help="a pass goes on past --batches until this much wall time (CPU time is read in "
        "10 ms ticks)",
    )
    parser.add_argument(
        "--warmup", type=int, default=2 * WORKERS + 1, help="untimed batches first (the queue)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="passes per row (best kept)")
    parser.add_argument("--only", default="", help="measure only rows whose name has this")
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the loaders under test bring their own parallelism
    cv2.setNumThreads(1)
    folder, paths, labels, shards = sample_data(args.data, args.num_images)

    rows: dict[str, Batches] = fastdata_rows(paths, labels, shards, args.batch_size)
    peers: list[tuple[str, Callable[[], dict[str, Batches]]]] = [
        ("timm", lambda: timm_rows(folder, args.batch_size)),
        ("torchvision.transforms.v2", lambda: torchvision_rows(paths, labels, args.batch_size)),
        ("albumentations", lambda: albumentations_rows(paths, labels, args.batch_size)),
        ("DALI", lambda: dali_rows(folder, args.batch_size)),
    ]
    for name, make_rows in peers:
        try:
            rows.update(make_rows())
        except ImportError as error:  # one line per missing peer
            print(f"skipped {name}: {error}")
    selected = {name: make for name, make in rows.items() if args.only in name}
    passes: dict[str, list[float]] = {name: [] for name in selected}
    cpu_passes: dict[str, list[float]] = {name: [] for name in selected}

    def measure(name: str, epochs: Epochs) -> float:
        wall, cpu = rates(epochs, args.batches, args.warmup, args.min_seconds)
        passes[name].append(wall)
        cpu_passes[name].append(cpu)
        return wall

    best = best_of_passes(selected, measure, args.repeats)
    per_cpu = {name: max(values, default=0.0) for name, values in cpu_passes.items()}

    print(
        "\n| loader | images/s (passes) | heavy cost | CPU ms per image | heavy cost, CPU |"
        "\n|---|---:|---:|---:|---:|"
    )
    for name, value in best.items():
        if not value:
            print(f"| {name} | failed | | | |")
            continue
        low = min(passes[name])
        light_name = name.replace("heavy", "light")
        cost = cpu_cost = ""
        if "heavy" in name and best.get(light_name):
            cost = f"{best[light_name] / value:.2f}x"
        if "heavy" in name and per_cpu.get(light_name) and per_cpu[name]:
            cpu_cost = f"{per_cpu[light_name] / per_cpu[name]:.2f}x"
        cpu_ms = f"{1e3 / per_cpu[name]:.2f}" if per_cpu[name] else ""
        print(
            f"| {name} | {value:,.0f} ({low:,.0f}-{value:,.0f}) | {cost} | {cpu_ms} | {cpu_cost} |"
        )
    ratios = _ratios(best)
    cpu_ratios = _ratios(per_cpu)
    for label, value in ratios.items():
        print(f"{label}: {value:.2f}x (per CPU second: {cpu_ratios.get(label, 0.0):.2f}x)")
    save(
        "augment",
        {
            "num_images": len(paths),
            "batch_size": args.batch_size,
            "workers": WORKERS,
            "timed_batches": args.batches,
            "min_seconds_per_pass": args.min_seconds,
            "warmup_batches": args.warmup,
            "repeats_best_of": args.repeats,
            "images_per_s": best,
            "images_per_s_passes": passes,
            "images_per_cpu_s": per_cpu,
            "ratios": ratios,
            "ratios_per_cpu_s": cpu_ratios,
        },
        partial=bool(args.only),
        publish=args.publish,
    )
    return 0


def _ratios(best: dict[str, float]) -> dict[str, float]:
    """The ratios the goals are stated in, for the rows measured."""
    out: dict[str, float] = {}
    files, shards = best.get("fastdata heavy, JPEG files"), best.get("fastdata heavy, uint8 shards")
    timm = best.get("timm create_loader heavy")
    others = [
        best.get(k, 0.0) for k in ("torchvision v2 heavy", "albumentations heavy", "DALI CPU heavy")
    ]
    fastest = max(others)
    if files and timm:
        out["fastdata heavy (JPEG files) / timm create_loader heavy"] = files / timm
    if shards and timm:
        out["fastdata heavy (uint8 shards) / timm create_loader heavy"] = shards / timm
    threads = best.get("fastdata heavy, uint8 shards, threads")
    if threads and timm:
        out["fastdata heavy (uint8 shards, threads) / timm create_loader heavy"] = threads / timm
    if files and fastest:
        out["fastdata heavy (JPEG files) / fastest of torchvision v2, albumentations, DALI CPU"] = (
            files / fastest
        )
    for kind in ("JPEG files", "uint8 shards", "uint8 shards, threads"):
        light, heavy = best.get(f"fastdata light, {kind}"), best.get(f"fastdata heavy, {kind}")
        if light and heavy:
            out[f"fastdata heavy cost over light ({kind})"] = light / heavy
    return out


if __name__ == "__main__":
    sys.exit(main())
