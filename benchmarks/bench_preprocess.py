"""Preprocessing time against FFCV's DatasetWriter and the decode+resize bound, one run.

The sample dataset (ImageNet-like JPEGs, ~500x375) is written by ``fastdata preprocess``
and by FFCV's ``DatasetWriter`` (when installed) back to back, for each job:

- ``raw_224`` / ``raw_256``: fastdata raw uint8 S x S (shorter side, centre crop) against
  FFCV ``RGBImageField(write_mode="raw", max_resolution=256)``;
- ``jpeg_256``: fastdata JPEG, longer side 256, quality 90, against FFCV
  ``write_mode="jpg"``, ``max_resolution=256``, ``jpeg_quality=90``.

Each job runs ``--rounds`` times per tool, back to back and alternating which tool goes
first; each tool's fastest run counts. Every fastdata run starts its own worker processes,
as one ``fastdata preprocess`` command does (the workers a job leaves idle for the next
job of the same process are stopped first), and FFCV's writer starts its pool per run.
Both use ``--workers`` processes and read the same files (FFCV through a map-style dataset
that opens each image with PIL, as torchvision's ImageFolder does). The ratio is FFCV's
time over fastdata's. The decode+resize bound is the single-core rate of fastdata's own
per-image work (decode, resize, statistics; one process, one OpenCV thread, measured right
before and after the runs, averaged) times the number of workers; its ratio is the job's
rate over that bound. The store bound adds what every job must do with the result: write
its bytes to a file and SHA-256 hash them (the shard checksum), in the same process.

    python benchmarks/bench_preprocess.py [--num-images 4000] [--workers N] [--rounds 3]

FFCV is not a dependency of fastdata; to include it (Linux):
``apt-get install libopencv-dev libturbojpeg0-dev pkg-config && pip install ffcv``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
from _harness import (  # benchmarks/ is on sys.path when run as a script
    REPO_ROOT,
    add_publish_argument,
    load_tool,
    save,
)
from PIL import Image

from fastdata._system import usable_cpus
from fastdata.preprocess import PreprocessOptions, preprocess
from fastdata.preprocess._pool import close_idle_pools
from fastdata.preprocess._sources import SourceItem, list_source
from fastdata.preprocess._task import build_fields, process_sample
from fastdata.preprocess.engine import ShardJob

ensure_sample_dataset = load_tool("make_sample_dataset").ensure_sample_dataset

_WARMUP_ITEMS = 20
_FFCV_MAX_RESOLUTION = 256
FFCV_INSTALL = "apt-get install libopencv-dev libturbojpeg0-dev pkg-config && pip install ffcv"
JOBS: dict[str, tuple[PreprocessOptions, str]] = {
    "raw_224": (PreprocessOptions(sizes=(224,)), "raw"),
    "raw_256": (PreprocessOptions(sizes=(256,)), "raw"),
    "jpeg_256": (PreprocessOptions(sizes=(256,), resize="longer", storage="jpeg"), "jpg"),
}


class ImageFiles:
    """``(PIL RGB image, label)`` per listed file: the dataset object FFCV's writer takes."""

    def __init__(self, items: list[SourceItem]) -> None:
        self.items = [(item.path, item.label) for item in items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, label = self.items[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label


def _stored_bytes(values: dict[str, Any]) -> list[Any]:
    """The image values of one processed sample as the shard stores them (arrays, bytes)."""
    return [value for name, value in values.items() if name.startswith("image")]


def _single_core_rates(items: list[SourceItem], job: ShardJob) -> tuple[float, float]:
    """Images/s of fastdata's per-image work in this process with one OpenCV thread: the
    work alone (decode, resize, statistics), and the same plus storing its bytes (written to
    a file and SHA-256 hashed, as the shard writer does with every byte of a shard). Both
    are timed per image, one after the other, so that they share the machine's moments."""
    cv2.setNumThreads(1)
    for item in items[:_WARMUP_ITEMS]:
        process_sample(item, job)
    hasher = hashlib.sha256()
    work_s = store_s = 0.0
    with tempfile.TemporaryFile() as scratch:
        for item in items[_WARMUP_ITEMS:]:
            started = time.perf_counter()
            values, _ = process_sample(item, job)
            processed = time.perf_counter()
            for value in _stored_bytes(values):
                hasher.update(value)
                scratch.write(value)
            work_s += processed - started
            store_s += time.perf_counter() - processed
    count = len(items) - _WARMUP_ITEMS
    return count / work_s, count / (work_s + store_s)


def _probe(probe: list[SourceItem], job: ShardJob) -> tuple[float, float]:
    context = multiprocessing.get_context("spawn")  # fresh: no inherited OpenCV threads
    with context.Pool(1) as pool:
        work_rate, store_rate = pool.apply(_single_core_rates, (probe, job))
        return float(work_rate), float(store_rate)


def run_ffcv(items: list[SourceItem], out: Path, write_mode: str, workers: int) -> float:
    """Seconds FFCV's DatasetWriter takes to write ``items`` (PIL-opened) to ``out``."""
    from ffcv.fields import IntField, RGBImageField  # noqa: PLC0415 - optional peer
    from ffcv.writer import DatasetWriter  # noqa: PLC0415

    out.unlink(missing_ok=True)
    started = time.perf_counter()
    writer = DatasetWriter(
        str(out),
        {
            "image": RGBImageField(
                write_mode=write_mode, max_resolution=_FFCV_MAX_RESOLUTION, jpeg_quality=90
            ),
            "label": IntField(),
        },
        num_workers=workers,
    )
    writer.from_indexed_dataset(ImageFiles(items))
    seconds = time.perf_counter() - started
    out.unlink(missing_ok=True)
    return seconds


def measure(
    src: Path,
    work: Path,
    name: str,
    workers: int,
    probe_items: int,
    *,
    rounds: int,
    with_ffcv: bool,
) -> dict[str, Any]:
    """``rounds`` back-to-back runs of each tool, alternating which goes first; each tool's
    best run counts (the machine is shared: the minimum is the least disturbed)."""
    options, ffcv_mode = JOBS[name]
    listing = list_source(src)
    out = work / f"fastdata-{name}"
    job = ShardJob(str(out), options, build_fields(listing, options), listing.kind)
    probe = listing.items[:: max(1, len(listing.items) // probe_items)][:probe_items]
    rates = [_probe(probe, job)]
    fastdata_runs: list[float] = []
    ffcv_runs: list[float] = []
    summary = None
    for round_index in range(rounds):
        order = ["fastdata", "ffcv"] if round_index % 2 == 0 else ["ffcv", "fastdata"]
        for tool in order:
            if tool == "fastdata":
                shutil.rmtree(out, ignore_errors=True)  # both tools start without output
                close_idle_pools()  # and without worker processes
                summary = preprocess(src, out, options, workers=workers, show_progress=False)
                fastdata_runs.append(summary.elapsed_s)
            elif with_ffcv:
                beton = work / f"ffcv-{name}.beton"
                ffcv_runs.append(run_ffcv(listing.items, beton, ffcv_mode, workers))
    rates.append(_probe(probe, job))
    assert summary is not None
    shutil.rmtree(out, ignore_errors=True)
    single = sum(rate[0] for rate in rates) / len(rates)
    bound = single * workers
    store_bound = sum(rate[1] for rate in rates) / len(rates) * workers
    seconds = min(fastdata_runs)
    ffcv_s = min(ffcv_runs) if ffcv_runs else None
    return {
        "images": summary.num_processed,
        "seconds": seconds,
        "seconds_all_rounds": fastdata_runs,
        "images_per_s": summary.num_processed / seconds,
        "bytes_written": summary.num_bytes,
        "ffcv_seconds": ffcv_s,
        "ffcv_seconds_all_rounds": ffcv_runs,
        "ratio_to_ffcv": None if ffcv_s is None else ffcv_s / seconds,
        "single_core_images_per_s": single,
        "decode_bound_images_per_s": bound,
        "ratio_to_decode_bound": summary.num_processed / seconds / bound,
        "store_bound_images_per_s": store_bound,
        "ratio_to_store_bound": summary.num_processed / seconds / store_bound,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=usable_cpus())
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "demo-data")
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS))
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tool per job")
    add_publish_argument(parser)
    args = parser.parse_args()
    src = ensure_sample_dataset(args.data / f"sample-{args.num_images}", args.num_images)
    work = args.data / "bench-preprocess-out"
    work.mkdir(parents=True, exist_ok=True)
    with_ffcv = importlib.util.find_spec("ffcv") is not None
    if not with_ffcv:
        print(f"FFCV not installed: its writer is skipped (to include it: {FFCV_INSTALL})")
    probe = min(400, args.num_images)
    results: dict[str, Any] = {
        "workers": args.workers,
        "num_images": args.num_images,
        "rounds": args.rounds,
    }
    for name in args.jobs:
        results[name] = measure(
            src, work, name, args.workers, probe, rounds=args.rounds, with_ffcv=with_ffcv
        )
    shutil.rmtree(work, ignore_errors=True)
    save("preprocess", results, partial=args.jobs != list(JOBS), publish=args.publish)
    print(f"{args.num_images} sample JPEGs, {args.workers} workers")
    for name in args.jobs:
        r = results[name]
        ffcv = (
            f"FFCV {r['ffcv_seconds']:5.1f} s  ratio {r['ratio_to_ffcv']:.2f}x  "
            if r["ffcv_seconds"] is not None
            else ""
        )
        print(
            f"{name:9s} fastdata {r['seconds']:5.1f} s ({r['images_per_s']:5.0f} images/s)  "
            f"{ffcv}decode bound {r['decode_bound_images_per_s']:5.0f} images/s "
            f"(ratio {r['ratio_to_decode_bound']:.2f}), with storing "
            f"{r['store_bound_images_per_s']:5.0f} (ratio {r['ratio_to_store_bound']:.2f})"
        )


if __name__ == "__main__":
    main()
