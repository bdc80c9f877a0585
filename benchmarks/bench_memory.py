"""Memory of a RAM-cached JPEG dataset read by DataLoader workers: the seeds' list of
``bytes`` against ``RAMDataset``'s one shared buffer.

For each cache, a fresh process loads it, runs one shuffled epoch through ``--workers``
forked workers (decoding every image) and sums the PSS of itself and its workers. The
same run over ``--baseline-images`` images (two batches per worker) measures what the
processes cost without data (interpreters, libraries, worker queues); the difference is
the growth caused by the cache, reported as a multiple of the payload (the JPEG bytes).
Target for RAMDataset: growth at most 1.1x the payload.

Usage::

    python benchmarks/bench_memory.py --num-images 200000 --workers 8   # the README's size
    python benchmarks/bench_memory.py --num-images 20000 --workers 4    # scaled down
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import add_publish_argument, load_tool, save

from fastdata._optional import import_optional
from fastdata._system import format_bytes
from fastdata.datasets import RAMDataset, passthrough_collate

CACHES = ("list-of-bytes", "RAMDataset")


class BytesListDataset(Dataset):
    """The seeds' cache: one Python ``bytes`` object per image, decoded on access."""

    def __init__(self, paths: list[str], labels: list[int]) -> None:
        self.data = [Path(p).read_bytes() for p in paths]
        self.labels = labels

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = cv2.imdecode(np.frombuffer(self.data[index], np.uint8), cv2.IMREAD_COLOR)
        return torch.from_numpy(image), self.labels[index]


def measure(cache: str, paths_file: Path, count: int, workers: int) -> dict[str, Any]:
    """Load ``count`` paths of ``paths_file`` into ``cache``, run one epoch on ``workers``
    workers, sum the PSS. The path and label lists are dropped once the cache is built:
    what remains is what the cache itself holds.

    Every run first reads and labels the whole path list, the baseline's too: the list is
    the caller's input, not the cache, and Python keeps part of its memory after it is
    freed (12 of 21 MB for 100,000 paths here), which would otherwise count as the cache's
    growth for both caches."""
    psutil = import_optional("psutil", "bench_memory (PSS of the processes)")
    all_paths = paths_file.read_text().splitlines()
    all_labels = [int(Path(p).parent.name.split("_")[1]) for p in all_paths]
    paths, labels = all_paths[:count], all_labels[:count]
    del all_paths, all_labels
    if cache == "RAMDataset":
        dataset: Dataset = RAMDataset(paths, labels, show_progress=False)
        collate: Any = passthrough_collate
    else:
        dataset = BytesListDataset(paths, labels)
        collate = None
    del paths, labels
    gc.collect()
    loader = DataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
        multiprocessing_context="fork",
        collate_fn=collate,
    )
    iterator = iter(loader)
    for _batch in iterator:
        pass
    pids = [os.getpid(), *(w.pid for w in iterator._workers)]  # type: ignore[attr-defined]
    pss = [psutil.Process(pid).memory_full_info().pss for pid in pids]
    return {"pss_bytes": sum(pss), "per_process": pss}


def run_case(cache: str, paths_file: Path, count: int, workers: int) -> dict[str, Any]:
    """``measure`` in a fresh interpreter, so that the caches do not see each other."""
    out = subprocess.run(
        [sys.executable, __file__, "--case", cache, "--paths-file", str(paths_file),
         "--count", str(count), "--workers", str(workers)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/fdbench"), help="cache folder")
    parser.add_argument("--num-images", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--baseline-images",
        type=int,
        default=0,
        help="images of the baseline run (default: two batches of 64 per worker)",
    )
    parser.add_argument("--case", choices=CACHES, help=argparse.SUPPRESS)
    parser.add_argument("--paths-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    if args.case:  # the child: one measurement, printed as JSON
        print(json.dumps(measure(args.case, args.paths_file, args.count, args.workers)))
        return 0
    folder = args.data / f"small-{args.num_images}"
    paths_file = folder / "paths.txt"
    if not paths_file.is_file():
        sample = load_tool("make_sample_dataset")
        written = sample.make_sample_dataset(folder, args.num_images, image_size=(64, 64))
        paths_file.write_text("\n".join(map(str, written)))
    paths = paths_file.read_text().splitlines()
    # Every worker must decode a few batches in the baseline too: an idle worker has not
    # yet touched the decoder's pages and would make the growth look larger than it is.
    args.baseline_images = args.baseline_images or 128 * max(1, args.workers)
    payload = sum(os.path.getsize(p) for p in paths)
    base_payload = sum(os.path.getsize(p) for p in paths[: args.baseline_images])
    rows = []
    print(f"{len(paths)} JPEGs, payload {format_bytes(payload)}, {args.workers} workers")
    print("| cache | total PSS | baseline PSS | growth | growth / payload |")
    print("|---|---:|---:|---:|---:|")
    for cache in CACHES:
        full = run_case(cache, paths_file, len(paths), args.workers)
        base = run_case(cache, paths_file, args.baseline_images, args.workers)
        growth = full["pss_bytes"] - base["pss_bytes"]
        ratio = growth / (payload - base_payload)
        rows.append({"cache": cache, "full": full, "baseline": base, "growth_bytes": growth,
                     "growth_over_payload": ratio})  # fmt: skip
        print(
            f"| {cache} | {format_bytes(full['pss_bytes'])} | {format_bytes(base['pss_bytes'])} "
            f"| {format_bytes(growth)} | {ratio:.2f}x |",
            flush=True,
        )
    summary = {"num_images": len(paths), "workers": args.workers, "payload_bytes": payload,
               "rows": rows}  # fmt: skip
    save("memory", summary, publish=args.publish)
    return 0


if __name__ == "__main__":
    sys.exit(main())
