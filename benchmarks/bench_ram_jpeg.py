"""RAMDataset over a user's own JPEG files, against the decode bounds measured in the same run.

Two photo sets, each built once under ``--workdir`` without a download: ``sample`` (the
generator in ``tools/make_sample_dataset.py``: crops of scikit-image's photographs at
ImageNet sizes, jittered, noisy, quality 75-95) and ``photos`` (scikit-image's bundled
photographs themselves, rescaled to ImageNet-like sizes, quality 90). Files are read into
RAM (``RAMDataset``); every figure of a set is taken in round-robin passes, best of
``--repeats``, so that the ratios compare figures from the same minutes of a shared
machine. Per set:

- bounds, one thread, plain loops over the bytes: libjpeg-turbo decode only (simplejpeg,
  fast DCT), the same with the accurate DCT fastdata decodes with, decode (fast DCT) +
  bilinear resize of the shorter side to 256 + centre crop 224, and the same with the
  accurate DCT and fastdata's antialiased resize kernel (the work the eval path does by
  design; ``eval_of_same_kernel_bound_cpu`` is the eval's ratio to it per CPU time);
- ``RAMDataset`` 1 thread: eval (``Resize(256)`` + ``CenterCrop(224)``, run in the decode)
  as a ratio to the decode + resize bound, and the same with the two transforms run after
  a whole decode, train (``RandomResizedCrop(224)`` + flip) as a ratio to the
  decode-only bound (eval and train also per CPU time of the process: ``*_cpu``, the
  bound's CPU seconds per image over the dataset's); eval with 2 threads as a ratio to 1
  thread, and the process's CPU time per image with 1 thread over that with 2 (its
  efficiency: 1.0 means the second thread adds no work, so 2 free cores give 2x up to the
  GIL-held share, which a loaded machine's wall-clock ratio cannot show);
- DataLoader with 2 workers: ``RAMDataset`` eval and train against a naive per-sample PIL
  loader (open the file, resize, crop, to tensor) doing the same;
- JPEG shards (the same files in one JPEG-mode shard set), eval with 2 workers, against
  FFCV's JPEG mode on the same photos when ``ffcv`` is importable (one line says it is
  skipped otherwise);
- every loader both per wall-clock second and per CPU second of its whole process tree
  (``*_cpu`` ratios: workers' processes or FFCV's threads included), loaders in reverse
  order every other pass, and the shards-over-FFCV wall-clock ratio of each pass
  (``shards_eval_over_ffcv_jpeg_per_pass``) beside the best-of ratio;
- the pixel difference of the fast DCT from the accurate one (mean and max levels of 255).

    python benchmarks/bench_ram_jpeg.py                  # 256 images per set
    python benchmarks/bench_ram_jpeg.py --num-images 64 --quick

Results: ``benchmarks/results/runs/ram_jpeg-<time>.json`` (``--publish``: also
``benchmarks/results/ram_jpeg.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import io
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import simplejpeg
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fastdata import RAMDataset, ShardDataset
from fastdata._resize import resize_image
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import add_publish_argument, load_tool, save, tree_cpu_seconds
from bench_resize import PHOTO_NAMES

SIDE, CROP, WORKERS = 256, 224, 2
_SIZES = ((500, 375), (375, 500), (500, 333), (480, 360), (333, 500), (500, 400))


def _shorter_to(height: int, width: int, side: int) -> tuple[int, int]:
    return (
        (side, round(width * side / height))
        if height <= width
        else (round(height * side / width), side)
    )


def build_photo_set(folder: Path, count: int) -> list[Path]:
    """scikit-image's photographs rescaled to ImageNet-like sizes, JPEG quality 90."""
    from skimage import data as photo_data  # noqa: PLC0415 - the demo extra

    folder.mkdir(parents=True, exist_ok=True)
    sources = [np.ascontiguousarray(getattr(photo_data, name)()[..., :3]) for name in PHOTO_NAMES]
    paths = []
    for k in range(count):
        path = folder / f"{k:05d}.jpg"
        paths.append(path)
        if path.exists():
            continue
        source = sources[k % len(sources)]
        image = cv2.resize(source, _SIZES[k % len(_SIZES)], interpolation=cv2.INTER_AREA)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=90)
        path.write_bytes(buffer.getvalue())
    return paths


def build_sets(workdir: Path, count: int) -> dict[str, list[Path]]:
    sample_root = workdir / f"sample-{count}"
    if not sample_root.exists():
        load_tool("make_sample_dataset").make_sample_dataset(
            sample_root, count, num_classes=10, seed=0
        )
    sample = sorted(sample_root.rglob("*.jpg"))
    return {"sample": sample, "photos": build_photo_set(workdir / f"photos-{count}", count)}


def eval_transform() -> Compose:
    return Compose([Resize(SIDE), CenterCrop(CROP)])


def train_transform() -> Compose:
    return Compose([RandomResizedCrop(CROP, seed=0), RandomHorizontalFlip(seed=0)])


def bound_pass(jpegs: Sequence[bytes], kind: str) -> Callable[[], int]:
    """One pass of a bound over the bytes: ``decode_fast``, ``decode_accurate``,
    ``decode_resize`` (fast DCT, bilinear shorter side to 256, centre crop 224) or
    ``decode_resize_same_kernel`` (the work the eval dataset does by design: accurate
    DCT, fastdata's antialiased resize kernel to 256, centre crop 224)."""
    accurate = kind in ("decode_accurate", "decode_resize_same_kernel")

    def one_pass() -> int:
        for data in jpegs:
            image = simplejpeg.decode_jpeg(data, fastdct=not accurate)
            if kind.startswith("decode_resize"):
                height, width = _shorter_to(image.shape[0], image.shape[1], SIDE)
                if kind == "decode_resize":
                    resized = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
                else:
                    resized = resize_image(image, width, height)
                top, left = (height - CROP) // 2, (width - CROP) // 2
                np.ascontiguousarray(resized[top : top + CROP, left : left + CROP])
        return len(jpegs)

    return one_pass


def rate_of(one_pass: Callable[[], int], min_seconds: float) -> tuple[float, float]:
    """Images/s of ``one_pass`` over at least ``min_seconds``, and the CPU seconds this
    process spent per image (all its threads: on a shared machine it does not depend on
    how much of the cores the process got)."""
    one_pass()
    count, started, cpu_started = 0, time.perf_counter(), time.process_time()
    while count == 0 or time.perf_counter() - started < min_seconds:
        count += one_pass()
    cpu_per_image = (time.process_time() - cpu_started) / count
    return count / (time.perf_counter() - started), cpu_per_image


def loader_rates(loader: Any, min_seconds: float) -> tuple[float, float]:
    """Images per second of wall clock and per CPU second of the whole process tree (the
    workers' processes or threads and the main process) over whole epochs, at least
    ``min_seconds``, after one untimed epoch (it starts the workers and compiles FFCV's
    pipeline). The CPU figure is the work an image costs, which the other tenants of a
    shared machine move far less than the wall clock."""
    for _batch in loader:
        pass
    count = 0
    started, cpu_started = time.perf_counter(), tree_cpu_seconds()
    while count == 0 or time.perf_counter() - started < min_seconds:
        for batch in loader:
            count += len(batch[0])
    wall, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu_started
    return count / wall, count / cpu if cpu > 0 else float("nan")


def dataset_pass(dataset: RAMDataset, batch: int) -> Callable[[], int]:
    """One pass of ``__getitems__`` over the dataset in the calling process."""
    indices = list(range(len(dataset)))

    def one_pass() -> int:
        for first in range(0, len(indices), batch):
            dataset.__getitems__(indices[first : first + batch])
        return len(indices)

    return one_pass


class PilSamples(Dataset[tuple[torch.Tensor, int]]):
    """The naive per-sample loader: open the file with PIL, resize, crop, to a tensor."""

    def __init__(self, paths: Sequence[Path], train: bool) -> None:
        self.paths, self.train = list(paths), train

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[index]) as opened:
            image = opened.convert("RGB")
        if self.train:
            rng = np.random.default_rng(index)
            side = int(min(image.size) * np.sqrt(rng.uniform(0.08, 1.0)))
            left = int(rng.integers(0, image.width - side + 1))
            top = int(rng.integers(0, image.height - side + 1))
            image = image.resize((CROP, CROP), Image.Resampling.BILINEAR,
                                 box=(left, top, left + side, top + side))  # fmt: skip
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            height, width = _shorter_to(image.height, image.width, SIDE)
            image = image.resize((width, height), Image.Resampling.BILINEAR)
            top, left = (height - CROP) // 2, (width - CROP) // 2
            image = image.crop((left, top, left + CROP, top + CROP))
        return torch.from_numpy(np.array(image)).permute(2, 0, 1), index


def write_shards(root: Path, paths: Sequence[Path]) -> Path:
    """The files as one JPEG-mode shard set (bytes as they are)."""
    if (root / "index.json").exists():
        return root
    fields = [FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
              FieldSpec("label", "array", "int64")]  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        for k, path in enumerate(paths):
            writer.append({"image": path.read_bytes(), "label": k % 10})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    return root


def ffcv_loader(paths: Sequence[Path], workdir: Path, batch: int) -> Any:
    """FFCV's JPEG mode on the same photos (written once), centre crop to 224."""
    fields_module = importlib.import_module("ffcv.fields")
    writer_module = importlib.import_module("ffcv.writer")
    decoders = importlib.import_module("ffcv.fields.decoders")
    loading = importlib.import_module("ffcv.loader")
    transforms = importlib.import_module("ffcv.transforms")
    beton = workdir / f"{workdir.name}-{len(paths)}.beton"
    if not beton.exists():

        class Images:
            def __len__(self) -> int:
                return len(paths)

            def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
                return np.asarray(Image.open(paths[index]).convert("RGB")), index % 10

        fields = {"image": fields_module.RGBImageField(write_mode="jpg", jpeg_quality=90),
                  "label": fields_module.IntField()}  # fmt: skip
        partial = beton.with_suffix(".partial")
        writer_module.DatasetWriter(str(partial), fields, num_workers=1).from_indexed_dataset(
            Images()
        )
        partial.rename(beton)
    pipelines = {
        "image": [decoders.CenterCropRGBImageDecoder((CROP, CROP), CROP / SIDE),
                  transforms.ToTensor(), transforms.ToTorchImage()],
        "label": [decoders.IntDecoder(), transforms.ToTensor()],
    }  # fmt: skip
    return loading.Loader(str(beton), batch_size=batch, num_workers=WORKERS,
                          order=loading.OrderOption.SEQUENTIAL, pipelines=pipelines)  # fmt: skip


def fast_dct_difference(jpegs: Sequence[bytes]) -> dict[str, float]:
    """Levels of 255 between simplejpeg's fast and accurate DCT (fancy upsampling kept)."""
    means, worst = [], 0
    for data in jpegs:
        accurate = simplejpeg.decode_jpeg(data).astype(np.int16)
        difference = np.abs(simplejpeg.decode_jpeg(data, fastdct=True) - accurate)
        means.append(float(difference.mean()))
        worst = max(worst, int(difference.max()))
    return {"mean_abs": round(float(np.mean(means)), 3), "max_abs": worst}


def measure_set(
    name: str, paths: Sequence[Path], workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    jpegs = [path.read_bytes() for path in paths]
    labels = list(range(len(paths)))

    def ram(transform: Compose, threads: int | None) -> RAMDataset:
        return RAMDataset(paths, labels, transform, num_threads=threads, show_progress=False)

    one_thread_eval, one_thread_train = ram(eval_transform(), 1), ram(train_transform(), 1)
    # the same eval with Resize + CenterCrop run as transforms after a whole decode
    eval_after_decode = ram(eval_transform(), 1)
    eval_after_decode.plan = dataclasses.replace(
        eval_after_decode.plan, decode_center=None, after_decode=None
    )
    two_thread_eval = ram(eval_transform(), 2)
    passes: dict[str, Callable[[], int]] = {
        "bound_decode_only": bound_pass(jpegs, "decode_fast"),
        "bound_decode_accurate_dct": bound_pass(jpegs, "decode_accurate"),
        "bound_decode_resize": bound_pass(jpegs, "decode_resize"),
        "bound_decode_resize_same_kernel": bound_pass(jpegs, "decode_resize_same_kernel"),
        "ram_eval_1_thread": dataset_pass(one_thread_eval, args.batch_size),
        "ram_eval_1_thread_transform_after_decode": dataset_pass(
            eval_after_decode, args.batch_size
        ),
        "ram_train_1_thread": dataset_pass(one_thread_train, args.batch_size),
        "ram_eval_2_threads": dataset_pass(two_thread_eval, args.batch_size),
    }
    common = {"batch_size": args.batch_size, "num_workers": WORKERS, "persistent_workers": True}
    loaders: dict[str, Any] = {
        "ram_eval_2_workers": ram(eval_transform(), None).loader(**common),
        "ram_train_2_workers": ram(train_transform(), None).loader(**common),
        "pil_eval_2_workers": DataLoader(PilSamples(paths, train=False), **common),
        "pil_train_2_workers": DataLoader(PilSamples(paths, train=True), **common),
        "shards_eval_2_workers": ShardDataset(
            write_shards(workdir / f"shards-{name}-{len(paths)}", paths),
            transform=eval_transform(),
        ).loader(**common),
    }
    notes = []
    if importlib.util.find_spec("ffcv") is None:
        notes.append("FFCV not importable: its JPEG mode was not measured (pip install ffcv)")
    else:
        loaders["ffcv_jpeg_eval_2_workers"] = ffcv_loader(paths, workdir, args.batch_size)
    best: dict[str, float] = {}
    cpu_s: dict[str, float] = {}
    loader_walls: dict[str, list[float]] = {key: [] for key in loaders}
    load_at_start = [round(value, 2) for value in os.getloadavg()]
    for repeat in range(args.repeats):
        for key, one_pass in passes.items():
            rate, cpu_per_image = rate_of(one_pass, args.min_seconds)
            best[key] = max(best.get(key, 0.0), rate)
            cpu_s[key] = min(cpu_s.get(key, np.inf), cpu_per_image)
        # every other pass in reverse order: no loader always follows the same one
        order = list(loaders) if repeat % 2 == 0 else list(reversed(loaders))
        for key in order:
            rate, per_cpu_second = loader_rates(loaders[key], args.min_seconds)
            loader_walls[key].append(round(rate, 1))
            best[key] = max(best.get(key, 0.0), rate)
            cpu_s[key] = min(cpu_s.get(key, np.inf), 1 / per_cpu_second)
    ratios: dict[str, float | list[float]] = {
        "eval_of_decode_resize_bound": best["ram_eval_1_thread"] / best["bound_decode_resize"],
        "eval_transform_after_decode_of_decode_resize_bound": (
            best["ram_eval_1_thread_transform_after_decode"] / best["bound_decode_resize"]
        ),
        # the same two per CPU time of this process: what a loaded machine's wall clock blurs
        "eval_of_decode_resize_bound_cpu": cpu_s["bound_decode_resize"]
        / cpu_s["ram_eval_1_thread"],
        # the same eval against a loop doing the same work (accurate DCT, antialiased
        # kernel): what the dataset's own per-sample path costs beyond it
        "eval_of_same_kernel_bound_cpu": cpu_s["bound_decode_resize_same_kernel"]
        / cpu_s["ram_eval_1_thread"],
        "train_of_decode_only_bound": best["ram_train_1_thread"] / best["bound_decode_only"],
        "train_of_decode_only_bound_cpu": cpu_s["bound_decode_only"] / cpu_s["ram_train_1_thread"],
        "eval_2_threads_over_1": best["ram_eval_2_threads"] / best["ram_eval_1_thread"],
        # CPU per image of 1 thread over 2: what 2 free cores would give, up to the GIL
        "eval_2_threads_cpu_efficiency": cpu_s["ram_eval_1_thread"] / cpu_s["ram_eval_2_threads"],
        "eval_2_workers_over_pil": best["ram_eval_2_workers"] / best["pil_eval_2_workers"],
        "train_2_workers_over_pil": best["ram_train_2_workers"] / best["pil_train_2_workers"],
        "fast_dct_speedup": best["bound_decode_only"] / best["bound_decode_accurate_dct"],
    }
    # the loaders per CPU second of their process tree (workers included)
    ratios["eval_2_workers_over_pil_cpu"] = (
        cpu_s["pil_eval_2_workers"] / cpu_s["ram_eval_2_workers"]
    )
    ratios["train_2_workers_over_pil_cpu"] = (
        cpu_s["pil_train_2_workers"] / cpu_s["ram_train_2_workers"]
    )
    if "ffcv_jpeg_eval_2_workers" in best:
        ratios["shards_eval_over_ffcv_jpeg"] = (
            best["shards_eval_2_workers"] / best["ffcv_jpeg_eval_2_workers"]
        )
        ratios["shards_eval_over_ffcv_jpeg_cpu"] = (
            cpu_s["ffcv_jpeg_eval_2_workers"] / cpu_s["shards_eval_2_workers"]
        )
        # the wall-clock ratio of each pass (the two measured minutes apart at most)
        ratios["shards_eval_over_ffcv_jpeg_per_pass"] = [
            round(ours / theirs, 3)
            for ours, theirs in zip(
                loader_walls["shards_eval_2_workers"],
                loader_walls["ffcv_jpeg_eval_2_workers"],
                strict=True,
            )
        ]
    return {
        "set": name,
        "num_images": len(paths),
        "load_average_1_5_15_at_start": load_at_start,
        "images_per_s": {key: round(rate, 1) for key, rate in best.items()},
        "cpu_us_per_image": {key: round(value * 1e6, 1) for key, value in cpu_s.items()},
        "loader_images_per_s_per_pass": loader_walls,
        "ratios": {
            key: value if isinstance(value, list) else round(value, 3)
            for key, value in ratios.items()
        },
        "fast_dct_difference_levels": fast_dct_difference(jpegs),
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="round-robin passes, best kept")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="0.5 s per measurement, 1 pass")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "fastdata-bench-ram-jpeg"
    )
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.min_seconds, args.repeats = 0.5, 1
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    sets = build_sets(args.workdir, args.num_images)
    results = [measure_set(name, paths, args.workdir, args) for name, paths in sets.items()]
    for result in results:
        print(f"[{result['set']}: {result['num_images']} JPEG files in RAM]")
        for key, rate in result["images_per_s"].items():
            print(f"  {key:34s} {rate:9.1f} img/s")
        for key, ratio in result["ratios"].items():
            shown = (
                ", ".join(f"{r:.2f}" for r in ratio) if isinstance(ratio, list) else f"{ratio:9.2f}"
            )
            print(f"  {key:34s} {shown}")
        difference = result["fast_dct_difference_levels"]
        print(f"  fast DCT vs accurate: {difference['mean_abs']} mean, {difference['max_abs']} "
              "max levels of 255")  # fmt: skip
        for note in result["notes"]:
            print(f"  {note}")
    summary = {"batch_size": args.batch_size, "repeats_best_of": args.repeats,
               "min_seconds": args.min_seconds, "sets": results}  # fmt: skip
    save("ram_jpeg", summary, partial=args.quick, publish=args.publish)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
