"""Preprocessing throughput against the decode-bound rate, measured in the same run.

The sample dataset (ImageNet-like JPEGs, ~500x375) → raw 224x224 shards with all workers;
then the same → JPEG shards (max side 256, quality 90). The decode-bound rate is the
single-core decode+resize rate (one process, one OpenCV thread, measured right before and
after the job, averaged) times the number of workers.

    python benchmarks/bench_preprocess.py [--num-images 4000] [--workers N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import time
from pathlib import Path

import cv2
from _harness import (  # benchmarks/ is on sys.path when run as a script
    REPO_ROOT,
    add_publish_argument,
    load_tool,
    save,
)

from fastdata._system import usable_cpus
from fastdata.preprocess import (
    PreprocessOptions,
    ShardJob,
    SourceItem,
    build_fields,
    list_source,
    preprocess,
    process_sample,
)

ensure_sample_dataset = load_tool("make_sample_dataset").ensure_sample_dataset

_WARMUP_ITEMS = 20


def _single_core_rate(items: list[SourceItem], job: ShardJob) -> float:
    """Images/s of decode+resize in this process with one OpenCV thread."""
    cv2.setNumThreads(1)
    for item in items[:_WARMUP_ITEMS]:
        process_sample(item, job)
    started = time.perf_counter()
    for item in items[_WARMUP_ITEMS:]:
        process_sample(item, job)
    return (len(items) - _WARMUP_ITEMS) / (time.perf_counter() - started)


def measure(
    src: Path, out: Path, options: PreprocessOptions, workers: int, probe_items: int
) -> dict[str, float]:
    listing = list_source(src)
    job = ShardJob(str(out), options, build_fields(listing, options), listing.kind)
    probe = listing.items[:: max(1, len(listing.items) // probe_items)][:probe_items]
    context = multiprocessing.get_context("spawn")  # fresh: no inherited OpenCV threads
    with context.Pool(1) as pool:  # a fresh process: no state shared with the job's pool
        before = pool.apply(_single_core_rate, (probe, job))
    summary = preprocess(src, out, options, workers=workers, overwrite=True, show_progress=False)
    with context.Pool(1) as pool:
        after = pool.apply(_single_core_rate, (probe, job))
    single = (before + after) / 2
    bound = single * workers
    return {
        "images": summary.num_processed,
        "seconds": summary.elapsed_s,
        "images_per_s": summary.images_per_s,
        "bytes_written": summary.num_bytes,
        "single_core_images_per_s": single,
        "decode_bound_images_per_s": bound,
        "ratio_to_decode_bound": summary.images_per_s / bound,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=usable_cpus())
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "demo-data")
    add_publish_argument(parser)
    args = parser.parse_args()
    src = ensure_sample_dataset(args.data / f"sample-{args.num_images}", args.num_images)
    out = args.data / "bench-preprocess-out"
    probe = min(400, args.num_images)
    results = {
        "raw_224": measure(src, out, PreprocessOptions(sizes=(224,)), args.workers, probe),
        "jpeg_256": measure(
            src,
            out,
            PreprocessOptions(sizes=(256,), resize="longer", storage="jpeg"),
            args.workers,
            probe,
        ),
        "workers": args.workers,
    }
    shutil.rmtree(out, ignore_errors=True)
    save("preprocess", results, publish=args.publish)
    print(f"{args.num_images} sample JPEGs, {args.workers} workers")
    for name in ("raw_224", "jpeg_256"):
        r = results[name]
        assert isinstance(r, dict)
        print(
            f"{name:9s} {r['seconds']:6.1f} s  {r['images_per_s']:7.0f} images/s  "
            f"decode bound {r['decode_bound_images_per_s']:7.0f} images/s  "
            f"ratio {r['ratio_to_decode_bound']:.2f}"
        )


if __name__ == "__main__":
    main()
