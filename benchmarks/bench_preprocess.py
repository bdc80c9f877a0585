"""Preprocessing against FFCV's DatasetWriter and its own decode+resize bound, one run.

The sample dataset (ImageNet-like JPEGs, ~500x375) is written by ``fastdata preprocess``
and by FFCV's ``DatasetWriter`` (when installed), for each job:

- ``raw_224`` / ``raw_256``: fastdata raw uint8 S x S (shorter side, centre crop) against
  FFCV ``RGBImageField(write_mode="raw", max_resolution=256)``;
- ``jpeg_256``: fastdata JPEG, longer side 256, quality 90, against FFCV
  ``write_mode="jpg"``, ``max_resolution=256``, ``jpeg_quality=90``.

Each round of a job measures three things back to back, the order rotating between
rounds so that none always follows the same one: the bound, a fastdata run and an FFCV
run. Both tools use ``--workers`` processes and read the same files (FFCV through a
map-style dataset that opens each image with PIL, as torchvision's ImageFolder does);
every fastdata run starts its own workers, as one ``fastdata preprocess`` command does
(workers an earlier job left idle are stopped first), and FFCV's writer starts its own.

Every figure is taken two ways: images per second of wall clock, and images per CPU
second of the whole process tree (this process, its worker processes and their threads:
FFCV's too), user + system time. On a machine shared with other work the wall clock
moves with the neighbours' load; the CPU an image costs moves far less, so the per-CPU
ratios are the fair comparison there (``*_cpu``). Each round's ratios are kept beside the
best-of ratios (fastest wall-clock run, cheapest CPU run of each tool).

The bound is fastdata's own per-image work (read the file, decode, resize, statistics:
:func:`process_sample`) in ``--workers`` processes at once, each looping over a probe of
the images (as many processes as the job has workers, so that both share the cores the
same way): its wall-clock rate is the sum of theirs, its CPU cost their CPU seconds per
image. The store bound adds, timed per image beside the work, what every job must do with
the result: write its bytes to a file and SHA-256 hash them (the shard checksum).
What preprocessing adds to the bound: the workers' start, the transfer of pixels to the
shard writer, the HDF5 shard, its fsync and checksum, statistics, the manifest.

    python benchmarks/bench_preprocess.py [--num-images 4000] [--workers N] [--rounds 3]

FFCV is not a dependency of fastdata; to include it (Linux):
``apt-get install libopencv-dev libturbojpeg0-dev pkg-config && pip install ffcv``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import multiprocessing
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
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
from fastdata.preprocess._task import SampleFailure, build_fields, process_sample
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

    def __init__(self, items: Sequence[SourceItem]) -> None:
        self.items = [(item.path, item.label) for item in items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, label = self.items[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process, its children that ended and were
    waited for (FFCV's and fastdata's workers once joined, the bound's probes) and its
    live descendants (workers still running, with what they reaped): a clock that only
    the process tree moves."""
    import psutil  # noqa: PLC0415 - only this benchmark needs it

    own = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime
    for process in psutil.Process().children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:  # ended meanwhile: counted once it is waited for
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


@dataclass
class Timed:
    """One measurement: images, wall-clock seconds, CPU seconds of the process tree."""

    images: int
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.images / self.wall_s

    @property
    def per_cpu_s(self) -> float:
        return self.images / self.cpu_s


def _stored_bytes(values: dict[str, Any]) -> list[Any]:
    """The image values of one processed sample as the shard stores them (arrays, bytes)."""
    return [value for name, value in values.items() if name.startswith("image")]


def _bound_process(items: Sequence[SourceItem], job: ShardJob) -> tuple[float, float, float, float]:
    """fastdata's per-image work over ``items`` in this process with one OpenCV thread:
    ``(wall s, CPU s)`` of the work alone (read, decode, resize, statistics), and the same
    two for storing its bytes (written to a file and SHA-256 hashed, as the shard writer
    does with every byte of a shard), each timed per image, one after the other."""
    cv2.setNumThreads(1)
    for item in items[:_WARMUP_ITEMS]:
        process_sample(item, job)
    hasher = hashlib.sha256()
    work_s = work_cpu_s = store_s = store_cpu_s = 0.0
    with tempfile.TemporaryFile() as scratch:
        for item in items[_WARMUP_ITEMS:]:
            started, cpu_started = time.perf_counter(), time.process_time()
            result = process_sample(item, job)
            processed, cpu_processed = time.perf_counter(), time.process_time()
            if isinstance(result, SampleFailure):  # the sample photos all decode
                raise RuntimeError(f"{result.path}: {result.reason}")
            for value in _stored_bytes(result[0]):
                hasher.update(value)
                scratch.write(value)
            work_s += processed - started
            work_cpu_s += cpu_processed - cpu_started
            store_s += time.perf_counter() - processed
            store_cpu_s += time.process_time() - cpu_processed
    return work_s, work_cpu_s, store_s, store_cpu_s


def measure_bound(probe: Sequence[SourceItem], job: ShardJob, workers: int) -> tuple[Timed, Timed]:
    """The bound (work) and the store bound, as ``workers`` processes loop over ``probe``
    at once (spawned: fresh, no inherited OpenCV threads)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers) as pool:
        pool.map(abs, range(workers))  # started (imports done) before the clock runs
        parts = pool.starmap(_bound_process, [(probe, job)] * workers)
    count = (len(probe) - _WARMUP_ITEMS) * workers
    work = Timed(count, max(p[0] for p in parts), sum(p[1] for p in parts))
    store = Timed(count, max(p[0] + p[2] for p in parts), sum(p[1] + p[3] for p in parts))
    # each process's wall clock: the rate is the sum of theirs
    work.wall_s = count / sum((len(probe) - _WARMUP_ITEMS) / p[0] for p in parts)
    store.wall_s = count / sum((len(probe) - _WARMUP_ITEMS) / (p[0] + p[2]) for p in parts)
    return work, store


def run_fastdata(src: Path, out: Path, options: PreprocessOptions, workers: int) -> Timed:
    """One ``preprocess`` run from no output and no workers to its workers stopped."""
    shutil.rmtree(out, ignore_errors=True)  # both tools start without output
    close_idle_pools()  # and without worker processes
    cpu_started = tree_cpu_s()
    summary = preprocess(src, out, options, workers=workers, show_progress=False)
    close_idle_pools()  # the workers' CPU time is the parent's to count once they end
    cpu_s = tree_cpu_s() - cpu_started
    shutil.rmtree(out, ignore_errors=True)
    return Timed(summary.num_processed, summary.elapsed_s, cpu_s)


def run_ffcv(items: Sequence[SourceItem], out: Path, write_mode: str, workers: int) -> Timed:
    """FFCV's DatasetWriter writing ``items`` (PIL-opened) to ``out``."""
    from ffcv.fields import IntField, RGBImageField  # noqa: PLC0415 - optional peer
    from ffcv.writer import DatasetWriter  # noqa: PLC0415

    out.unlink(missing_ok=True)
    started, cpu_started = time.perf_counter(), tree_cpu_s()
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
    timed = Timed(len(items), time.perf_counter() - started, tree_cpu_s() - cpu_started)
    out.unlink(missing_ok=True)
    return timed


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
    """``rounds`` rounds of the bound, a fastdata run and an FFCV run, in an order that
    rotates between rounds; best-of and per-round ratios, by wall clock and per CPU."""
    options, ffcv_mode = JOBS[name]
    listing = list_source(src)
    out = work / f"fastdata-{name}"
    job = ShardJob(str(out), options, build_fields(listing, options), listing.kind)
    probe = listing.items[:: max(1, len(listing.items) // probe_items)][:probe_items]
    runs: dict[str, list[Timed]] = {"bound": [], "store_bound": [], "fastdata": [], "ffcv": []}
    tools = ["bound", "fastdata", "ffcv"] if with_ffcv else ["bound", "fastdata"]
    for round_index in range(rounds):
        shift = round_index % len(tools)
        for tool in tools[shift:] + tools[:shift]:
            if tool == "bound":
                bound, store_bound = measure_bound(probe, job, workers)
                runs["bound"].append(bound)
                runs["store_bound"].append(store_bound)
            elif tool == "fastdata":
                runs["fastdata"].append(run_fastdata(src, out, options, workers))
            else:
                beton = work / f"ffcv-{name}.beton"
                runs["ffcv"].append(run_ffcv(listing.items, beton, ffcv_mode, workers))
    result: dict[str, Any] = {"images": runs["fastdata"][0].images}
    for tool, timed in runs.items():
        result[tool] = {
            "images_per_s_per_round": [round(t.per_s, 1) for t in timed],
            "images_per_cpu_s_per_round": [round(t.per_cpu_s, 1) for t in timed],
        }
    ratios: dict[str, Any] = {}
    pairs = [("of_bound", "fastdata", "bound"), ("of_store_bound", "fastdata", "store_bound")]
    if with_ffcv:
        pairs.append(("over_ffcv", "fastdata", "ffcv"))
    for key, ours, theirs in pairs:
        for suffix, rate in (("", attrgetter("per_s")), ("_cpu", attrgetter("per_cpu_s"))):
            ours_rates = [rate(t) for t in runs[ours]]
            their_rates = [rate(t) for t in runs[theirs]]
            ratios[f"{key}{suffix}"] = round(max(ours_rates) / max(their_rates), 3)
            ratios[f"{key}{suffix}_per_round"] = [
                round(a / b, 3) for a, b in zip(ours_rates, their_rates, strict=True)
            ]
    result["ratios"] = ratios
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=usable_cpus())
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "demo-data")
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS))
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per job (bound, fastdata, FFCV each)"
    )
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
        "load_average_1_5_15_at_start": [round(v, 2) for v in os.getloadavg()],
    }
    for name in args.jobs:
        results[name] = measure(
            src, work, name, args.workers, probe, rounds=args.rounds, with_ffcv=with_ffcv
        )
    shutil.rmtree(work, ignore_errors=True)
    save("preprocess", results, partial=args.jobs != list(JOBS), publish=args.publish)
    print(f"{args.num_images} sample JPEGs, {args.workers} workers, {args.rounds} rounds")
    for name in args.jobs:
        print(f"[{name}]  best images/s | best images per CPU second (per round)")
        for tool in ("bound", "store_bound", "fastdata", "ffcv"):
            r = results[name][tool]
            if r["images_per_s_per_round"]:
                walls = ", ".join(f"{v:.0f}" for v in r["images_per_s_per_round"])
                cpus = ", ".join(f"{v:.0f}" for v in r["images_per_cpu_s_per_round"])
                print(f"  {tool:12s} {max(r['images_per_s_per_round']):6.0f} ({walls}) | "
                      f"{max(r['images_per_cpu_s_per_round']):6.0f} ({cpus})")  # fmt: skip
        ratios = results[name]["ratios"]
        for key, value in ratios.items():
            if not key.endswith("_per_round"):
                rounds = ", ".join(f"{v:.2f}" for v in ratios[f"{key}_per_round"])
                print(f"  {key:20s} {value:5.2f}  (rounds: {rounds})")


if __name__ == "__main__":
    main()
