# ruff: noqa: PLC0415 - each peer is imported where its rows are built (missing: skipped)
"""Detection augmentation from JPEG files and uint8 shards: fastdata against
torchvision.transforms.v2, albumentations and DALI's CPU pipeline.

Every row: decode + SSD IoU crop + horizontal flip + resize to 512x512 + box sanitising,
batch 16, 2 DataLoader workers (DALI: 2 threads), on scikit-image's photographs at
ImageNet-like sizes (``bench_ram_jpeg``'s photo set) with seeded synthetic boxes, 1 to 8
per image (4.5 on average). Rows end with the uint8 images and each sample's boxes and
labels in the training process.

- fastdata, JPEG shards: the same JPEG bytes, boxes and labels in a shard set (what
  ``fastdata preprocess`` writes when it keeps the JPEGs), read by ``ShardDataset(root,
  fields=("image", "boxes", "labels"), transform=Compose([RandomIoUCrop(size=512),
  RandomHorizontalFlip()]))``: the leading IoU crop runs in the decode (drawn from the JPEG
  header's size and the boxes, decoded and resized in one step), the flip in place, boxes
  and labels clipped and dropped below 1 px or 10 % visible.
- fastdata, uint8 shards: the photos letterboxed to 512x512 once, boxes and labels stored
  beside them as ragged fields; the same ``ShardDataset`` call (the IoU crop crops and
  resizes in one pass).
- Every fastdata row iterates ``dataset.loader(batch_size=16, shuffle=True,
  drop_last=True, num_workers=2, persistent_workers=True)``, what a user writes (its
  workers reuse the shared memory of batches the loop has let go of); "main process, 2
  threads": the same with ``num_workers=0`` and the batch's samples on 2 threads in the
  training process (``num_threads=2``): the same two cores of parallelism, no batch
  crossing a process boundary.
- torchvision.transforms.v2: ``RandomIoUCrop``, ``RandomHorizontalFlip``, ``Resize``,
  ``SanitizeBoundingBoxes`` on ``tv_tensors`` per sample, JPEGs decoded by
  ``torchvision.io.decode_jpeg``.
- albumentations: ``RandomSizedBBoxSafeCrop(512, 512)`` (it has no IoU crop; this one keeps
  every box, a lighter rule) + ``HorizontalFlip``, ``min_visibility=0.1``, ``cv2.imdecode``.
- DALI CPU: ``fn.random_bbox_crop`` (the same thresholds, scales and aspect ratios) +
  ``fn.slice`` + ``fn.resize`` + ``fn.flip`` / ``fn.bb_flip``, ``device_id=None``.

Beside the rate, each loader runs once over the same boxes painted white on black (the
objects' pixels): "kept visible" is the share of object pixels still in the output that lie
inside an output box (a box dropped while part of its object shows loses those pixels).
Per row: ``--warmup`` untimed batches, then ``--batches`` timed, in ``--repeats``
round-robin passes (best kept). Peers that do not import are skipped with one line. One
command::

    PYTHONPATH=. python benchmarks/bench_detection.py --num-images 1000

with a Python whose environment has the peers (torchvision needs a CPU build beside the
CPU torch; see ``shared/tools``). Results: ``benchmarks/results/runs/detection-<time>.json``
(``--publish``: also ``benchmarks/results/detection.json``).
"""

from __future__ import annotations

import argparse
import gc
import io
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    add_publish_argument,
    best_of_passes,
    images_per,
    save,
    tree_cpu_seconds,
)
from bench_ram_jpeg import build_photo_set

from fastdata._codec import decode_image
from fastdata._fields import apply_geometry  # the uint8 set's boxes follow its letterbox
from fastdata.datasets import ShardDataset
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import (
    Compose,
    FieldBatch,
    Letterbox,
    RandomHorizontalFlip,
    RandomIoUCrop,
)

SIZE, BATCH, WORKERS, SEED = 512, 16, 2, 0
THRESHOLDS = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9]
Batch = tuple[Any, list[np.ndarray]]  # images, boxes per sample (output pixels)
Rows = dict[str, Callable[[], Iterable[Batch]]]


# -- data ------------------------------------------------------------------------------------
class Sample:
    """Encoded images in one buffer and their boxes and labels in flat arrays: nothing per
    sample for forked workers to copy on touch."""

    def __init__(
        self, encoded: Sequence[bytes], boxes: Sequence[np.ndarray], labels: Sequence[np.ndarray]
    ) -> None:
        self.data = np.frombuffer(b"".join(encoded), np.uint8)
        self.starts = np.cumsum([0, *map(len, encoded)])
        self.box_rows = np.concatenate(boxes).astype(np.float32)
        self.box_labels = np.concatenate(labels).astype(np.int64)
        self.box_starts = np.cumsum([0, *map(len, boxes)])

    def __len__(self) -> int:
        return len(self.starts) - 1

    def encoded(self, index: int) -> np.ndarray:
        return self.data[self.starts[index] : self.starts[index + 1]]

    def boxes(self, index: int) -> np.ndarray:
        return self.box_rows[self.box_starts[index] : self.box_starts[index + 1]]

    def labels(self, index: int) -> np.ndarray:
        return self.box_labels[self.box_starts[index] : self.box_starts[index + 1]]


def synthetic_boxes(
    sizes: Sequence[tuple[int, int]], seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """1 to 8 boxes per ``(height, width)`` image (4.5 on average), sides 8-60 % of the
    image's, and a class 0-9 each."""
    rng = np.random.default_rng(seed)
    boxes, labels = [], []
    for height, width in sizes:
        count = int(rng.integers(1, 9))
        sides = rng.uniform(0.08, 0.6, (count, 2)) * [width, height]
        corners = rng.uniform(0, 1, (count, 2)) * ([width, height] - sides)
        boxes.append(np.concatenate([corners, corners + sides], 1).astype(np.float32))
        labels.append(rng.integers(0, 10, count))
    return boxes, labels


def painted_jpegs(sizes: Sequence[tuple[int, int]], boxes: Sequence[np.ndarray]) -> list[bytes]:
    """The objects' pixels: each image's boxes white on black, JPEG quality 95."""
    encoded = []
    for (height, width), rows in zip(sizes, boxes, strict=True):
        image = np.zeros((height, width, 3), np.uint8)
        for x1, y1, x2, y2 in np.round(rows).astype(int):
            image[y1:y2, x1:x2] = 255
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=95)
        encoded.append(buffer.getvalue())
    return encoded


def build_shards(sample: Sample, out: Path) -> tuple[Path, list[np.ndarray]]:
    """The photos letterboxed to SIZE x SIZE as raw uint8 (once), and their boxes moved."""
    letterbox = Letterbox(SIZE)
    moved = []
    for index in range(len(sample)):
        height, width = decode_image(sample.encoded(index)).shape[:2]
        geometry = letterbox.geometry(np.array([height]), np.array([width]), FieldBatch({}))
        targets = FieldBatch({"boxes": [sample.boxes(index)]}, {"boxes": "boxes"})
        moved.append(apply_geometry(letterbox, targets, geometry)["boxes"][0])
    if (out / "index.json").is_file():
        return out, moved
    out.mkdir(parents=True, exist_ok=True)
    fields = [
        FieldSpec("image", "array", "uint8", (SIZE, SIZE, 3), "HWC", role="image"),
        FieldSpec("boxes", "ragged", "float32", (4,), role="boxes"),
        FieldSpec("labels", "ragged", "int64", (), role="box_labels"),
    ]
    with ShardWriter(out / "shard-00000.h5", fields) as writer:
        for index in range(len(sample)):
            image = decode_image(sample.encoded(index))
            writer.append(
                {
                    "image": letterbox.apply_all([image], [], None, 1)[0][0],
                    "boxes": moved[index],
                    "labels": sample.labels(index),
                }
            )
        infos = [writer.close()]
    save_manifest(out, Manifest(fields=fields, shards=infos, class_names=[]))
    return out, moved


# -- fastdata --------------------------------------------------------------------------------
def shard_dataset(root: Path, threads: int = 1) -> ShardDataset:
    """What a user writes: the stored fields with their roles and one batch transform;
    one thread per worker, as every other row has (two workers on two cores), or
    ``threads`` in the main process."""
    transform = Compose([RandomIoUCrop(seed=SEED, size=SIZE), RandomHorizontalFlip(seed=SEED)])
    fields = ("image", "boxes", "labels")
    return ShardDataset(root, fields=fields, transform=transform, num_threads=threads)


def _loader(dataset: Dataset, workers: int = WORKERS, **kwargs: Any) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        **kwargs,
    )


def _as_batches(loader: Iterable[Any]) -> Iterator[Batch]:
    for images, boxes, _labels in loader:
        yield images, [np.asarray(rows) for rows in boxes]


class Epochs:
    """A loader made once (workers kept), iterated epoch after epoch."""

    def __init__(self, loader: Iterable[Any], convert: Callable[[Iterable[Any]], Iterator[Batch]]):
        self.loader, self.convert = loader, convert

    def __iter__(self) -> Iterator[Batch]:
        return self.convert(self.loader)


def fastdata_rows(jpeg_shards: Path, uint8_shards: Path) -> Rows:
    def epochs(root: Path, workers: int = WORKERS) -> Epochs:
        # "main process": num_workers=0, the batch's samples on WORKERS threads (the same
        # two cores of parallelism)
        dataset = shard_dataset(root, 1 if workers else WORKERS)
        loader = dataset.loader(
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        return Epochs(loader, _as_batches)

    return {
        "fastdata, JPEG shards (crop in the decode)": lambda: epochs(jpeg_shards),
        "fastdata, JPEG shards (crop in the decode, main process, 2 threads)": lambda: epochs(
            jpeg_shards, 0
        ),
        "fastdata, uint8 shards": lambda: epochs(uint8_shards),
        "fastdata, uint8 shards (main process, 2 threads)": lambda: epochs(uint8_shards, 0),
    }


def build_jpeg_shards(sample: Sample, out: Path) -> Path:
    """The same JPEG bytes, boxes and labels in a shard set (once): what ``fastdata
    preprocess`` writes when it keeps JPEGs as they are."""
    if (out / "index.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding="jpeg", role="image"),
        FieldSpec("boxes", "ragged", "float32", (4,), role="boxes"),
        FieldSpec("labels", "ragged", "int64", (), role="box_labels"),
    ]
    with ShardWriter(out / "shard-00000.h5", fields) as writer:
        for index in range(len(sample)):
            writer.append(
                {
                    "image": sample.encoded(index).tobytes(),
                    "boxes": sample.boxes(index),
                    "labels": sample.labels(index),
                }
            )
        infos = [writer.close()]
    save_manifest(out, Manifest(fields=fields, shards=infos, class_names=[]))
    return out


# -- peers -----------------------------------------------------------------------------------
class PerSample(Dataset):
    """One sample at a time through ``transform(encoded, boxes, labels)``."""

    def __init__(self, sample: Sample, transform: Callable[..., Any]) -> None:
        self.sample, self.transform = sample, transform

    def __len__(self) -> int:
        return len(self.sample)

    def __getitem__(self, index: int) -> Any:
        sample = self.sample
        return self.transform(sample.encoded(index), sample.boxes(index), sample.labels(index))


def _list_collate(items: list[tuple[Any, Any, Any]]) -> tuple[Any, list[Any], list[Any]]:
    images, boxes, labels = zip(*items, strict=True)
    return torch.stack(list(images)), list(boxes), list(labels)


def torchvision_rows(sample: Sample) -> Rows:
    import torchvision
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    pipeline = v2.Compose(
        [
            v2.RandomIoUCrop(),
            v2.RandomHorizontalFlip(),
            v2.Resize((SIZE, SIZE), antialias=True),
            v2.SanitizeBoundingBoxes(min_size=1),
        ]
    )

    def transform(encoded: np.ndarray, boxes: np.ndarray, labels: np.ndarray) -> Any:
        image = torchvision.io.decode_jpeg(torch.from_numpy(encoded.copy()))
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.from_numpy(boxes), format="XYXY", canvas_size=tuple(image.shape[-2:])
            ),
            "labels": torch.from_numpy(labels),
        }
        out, moved = pipeline(tv_tensors.Image(image), target)
        return (
            out.as_subclass(torch.Tensor),
            moved["boxes"].as_subclass(torch.Tensor),
            moved["labels"],
        )

    return {
        "torchvision.transforms.v2": lambda: Epochs(
            _loader(PerSample(sample, transform), collate_fn=_list_collate), _as_batches
        )
    }


def albumentations_rows(sample: Sample) -> Rows:
    import albumentations as album

    pipeline = album.Compose(
        [album.RandomSizedBBoxSafeCrop(SIZE, SIZE), album.HorizontalFlip()],
        bbox_params=album.BboxParams(
            format="pascal_voc", label_fields=["labels"], min_visibility=0.1, min_area=1
        ),
    )

    def transform(encoded: np.ndarray, boxes: np.ndarray, labels: np.ndarray) -> Any:
        image = cv2.cvtColor(cv2.imdecode(encoded, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        height, width = image.shape[:2]
        clipped = np.clip(boxes, 0, [width, height, width, height])
        out = pipeline(image=image, bboxes=clipped, labels=labels)
        image_out = torch.from_numpy(out["image"]).permute(2, 0, 1)
        return image_out, np.asarray(out["bboxes"], np.float32).reshape(-1, 4), out["labels"]

    return {
        "albumentations (RandomSizedBBoxSafeCrop)": lambda: Epochs(
            _loader(PerSample(sample, transform), collate_fn=_list_collate), _as_batches
        )
    }


class _DaliEpochs:
    """DALI pipeline outputs as batches: one epoch is ``len(sample) // BATCH`` runs."""

    def __init__(self, pipe: Any, batches: int) -> None:
        self.pipe, self.batches = pipe, batches

    def __iter__(self) -> Iterator[Batch]:
        for _ in range(self.batches):
            images, boxes, _labels = self.pipe.run()
            pixels = images.as_array()  # (B, SIZE, SIZE, 3): uniform after the resize
            rows = [np.asarray(boxes.at(k)).reshape(-1, 4) * SIZE for k in range(len(boxes))]
            yield torch.from_numpy(pixels).permute(0, 3, 1, 2), rows


def dali_rows(sample: Sample) -> Rows:
    from nvidia.dali import fn, pipeline_def, types

    def source(info: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        order = np.random.default_rng(info.iteration).permutation(len(sample))
        index = int(order[info.idx_in_epoch % len(sample)])
        height, width = _jpeg_size(sample.encoded(index))
        relative = sample.boxes(index) / np.array([width, height, width, height], np.float32)
        return (
            sample.encoded(index).copy(),
            np.clip(relative, 0, 1).astype(np.float32),
            sample.labels(index).astype(np.int32),
        )

    def run() -> Iterable[Batch]:
        @pipeline_def(batch_size=BATCH, num_threads=WORKERS, device_id=None, seed=SEED)
        def pipe() -> Any:
            jpegs, boxes, labels = fn.external_source(
                source=source,
                num_outputs=3,
                batch=False,
                dtype=[types.UINT8, types.FLOAT, types.INT32],
            )
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            anchor, shape, boxes, labels = fn.random_bbox_crop(
                boxes,
                labels,
                device="cpu",
                aspect_ratio=[0.5, 2.0],
                thresholds=THRESHOLDS,
                scaling=[0.3, 1.0],
                bbox_layout="xyXY",
                allow_no_crop=True,
                num_attempts=40,
            )
            images = fn.slice(images, anchor, shape, axis_names="WH")
            images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
            flip = fn.random.coin_flip(probability=0.5)
            images = fn.flip(images, horizontal=flip)
            boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
            return images, boxes, labels

        built = pipe()
        built.build()
        return _DaliEpochs(built, len(sample) // BATCH)

    return {"DALI CPU": run}


def _jpeg_size(encoded: np.ndarray) -> tuple[int, int]:
    from fastdata._codec import jpeg_size

    size = jpeg_size(encoded)
    if size is None:
        raise ValueError("not a JPEG")
    return size


# -- measuring -------------------------------------------------------------------------------
def rates(epochs: Iterable[Batch], batches: int, warmup: int) -> tuple[float, float]:
    """Images per second of wall time and per CPU second (every process of the loader):
    the second does not count time other tenants of the machine took, so it stays steady
    on a shared one."""
    wall, cpu = images_per(epochs, batches, warmup, [time.perf_counter, tree_cpu_seconds])
    return wall, cpu


def kept_visible(epochs: Iterable[Batch], batches: int) -> float:
    """Share of object pixels (painted white) in the outputs that lie inside an output box."""
    visible = covered = 0
    cols = np.arange(SIZE) + 0.5
    for number, (images, boxes) in enumerate(epochs):
        if number == batches:
            break
        pixels = np.asarray(images)  # (B, 3, SIZE, SIZE)
        for image, rows in zip(pixels, boxes, strict=True):
            objects = image.mean(axis=0) > 127
            inside = np.zeros((SIZE, SIZE), bool)
            for x1, y1, x2, y2 in np.asarray(rows, np.float64).reshape(-1, 4):
                in_x = (cols >= x1) & (cols <= x2)
                in_y = (cols >= y1) & (cols <= y2)
                inside |= in_y[:, None] & in_x[None, :]
            visible += int(objects.sum())
            covered += int((objects & inside).sum())
    return covered / visible if visible else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/fdbench"), help="cache folder")
    parser.add_argument("--num-images", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=12, help="timed batches per pass")
    parser.add_argument(
        "--warmup", type=int, default=2 * WORKERS + 1, help="untimed batches first (the queue)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="passes per row (best kept)")
    parser.add_argument("--accuracy-batches", type=int, default=8, help="painted batches")
    parser.add_argument("--only", default="", help="measure only rows whose name has this")
    parser.add_argument("--quick", action="store_true", help="a few images and batches (CI)")
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.num_images, args.batches, args.warmup, args.repeats = 48, 2, 1, 1
        args.accuracy_batches = 2
    torch.set_num_threads(1)  # the loaders under test bring their own parallelism
    cv2.setNumThreads(1)
    paths = build_photo_set(args.data / f"photos-{args.num_images}", args.num_images)
    encoded = [path.read_bytes() for path in paths]
    sizes = [_jpeg_size(np.frombuffer(data, np.uint8)) for data in encoded]
    boxes, labels = synthetic_boxes(sizes, SEED)
    photos = Sample(encoded, boxes, labels)
    painted = Sample(painted_jpegs(sizes, boxes), boxes, labels)
    shards = build_shards(photos, args.data / f"detection-shards-boxes-{SIZE}-{args.num_images}")
    painted_shards = build_shards(
        painted, args.data / f"detection-painted-shards-boxes-{SIZE}-{args.num_images}"
    )

    def all_rows(sample: Sample, shard_set: tuple[Path, list[np.ndarray]]) -> Rows:
        name = "painted-" if sample is painted else ""
        jpeg_root = args.data / f"detection-{name}jpeg-shards-{args.num_images}"
        rows = fastdata_rows(build_jpeg_shards(sample, jpeg_root), shard_set[0])
        for name, make_rows in (
            ("torchvision.transforms.v2", torchvision_rows),
            ("albumentations", albumentations_rows),
            ("DALI", dali_rows),
        ):
            try:
                rows.update(make_rows(sample))
            except ImportError as error:  # one line per missing peer
                print(f"skipped {name}: {error}")
        return {name: make for name, make in rows.items() if args.only in name}

    selected = all_rows(photos, shards)
    per_cpu: dict[str, float] = {}

    def measure(name: str, epochs: Iterable[Batch]) -> float:
        wall, cpu = rates(epochs, args.batches, args.warmup)
        per_cpu[name] = max(per_cpu.get(name, 0.0), cpu)
        return wall

    best = best_of_passes(selected, measure, args.repeats)
    accuracy_rows = all_rows(painted, painted_shards)
    kept: dict[str, float] = {}
    for name in sorted(accuracy_rows, key=lambda name: name.startswith("DALI")):
        try:
            kept[name] = kept_visible(accuracy_rows[name](), args.accuracy_batches)
        except Exception as error:  # a peer's pipeline that does not run here
            print(f"kept visible, {name}: failed: {type(error).__name__}: {str(error)[:200]}")
        finally:
            gc.collect()

    fastest = max((v for n, v in best.items() if not n.startswith("fastdata")), default=0.0)
    fastest_cpu = max((v for n, v in per_cpu.items() if not n.startswith("fastdata")), default=0.0)
    print(
        "\n| loader | images/s | vs fastest peer | images per CPU second | vs fastest peer "
        "| kept visible object pixels |\n|---|---:|---:|---:|---:|---:|"
    )
    for name, value in best.items():
        ratio = f"{value / fastest:.2f}x" if fastest and value else ""
        cpu = per_cpu.get(name, 0.0)
        cpu_ratio = f"{cpu / fastest_cpu:.2f}x" if fastest_cpu and cpu else ""
        share = f"{100 * kept[name]:.1f} %" if name in kept else ""
        print(f"| {name} | {value:,.1f} | {ratio} | {cpu:,.1f} | {cpu_ratio} | {share} |")
    ratios = {
        f"{name} / fastest peer": value / fastest
        for name, value in best.items()
        if name.startswith("fastdata") and fastest and value
    }
    ratios |= {
        f"{name} / fastest peer, per CPU second": value / fastest_cpu
        for name, value in per_cpu.items()
        if name.startswith("fastdata") and fastest_cpu and value
    }
    save(
        "detection",
        {
            "num_images": len(paths),
            "batch_size": BATCH,
            "workers": WORKERS,
            "output_size": SIZE,
            "boxes_per_image": float(np.mean([len(rows) for rows in boxes])),
            "timed_batches": args.batches,
            "warmup_batches": args.warmup,
            "repeats_best_of": args.repeats,
            "images_per_s": best,
            "images_per_cpu_s": per_cpu,
            "ratios": ratios,
            "kept_visible_object_pixels": kept,
        },
        partial=bool(args.only) or args.quick,
        publish=args.publish,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
